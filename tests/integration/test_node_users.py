"""The main flows as most real clusters are reached: an ordinary user with passwordless
sudo (the `ubuntu` of cloud images), with a home per node or one home every node shares
(an NFS home). Root with private homes is what every other sandbox module runs. Each
configuration gets a 3-node sandbox of its own and runs its flow once: doctor,
provision (every step, /etc/hosts, firewall and the image through sudo; the smoke
test), launch, jobs, logs, stop. A user without sudo gets findings and a refusal that
changes nothing."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import tarfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.cli import CliResult, gpucluster
from tests.sandbox import Sandbox, busybox_image, start_sandbox

pytestmark = pytest.mark.sandbox

NAME, SUBNET, USER = "gpcuser", "198.19.6.0/24", "gcuser"
TRAIN = Path(__file__).parents[2] / "examples" / "train.py"
FIREWALL = ("iptables -A INPUT -i lo -j ACCEPT; iptables -A INPUT -m conntrack --ctstate "
            "ESTABLISHED,RELATED -j ACCEPT; iptables -A INPUT -p tcp --dport 22 -j ACCEPT; "
            "iptables -P INPUT DROP")


# Stands in for torchrun in a busybox image: says where it runs and writes a file into
# the mounted work dir (whose owner must stay the node user).
IMAGE_TORCHRUN = b"""#!/bin/sh
echo "in container: pwd=$PWD marker=$GPUCLUSTER_JOB"
echo made > "$PWD/made-in-container"
sleep "${FAKE_SLEEP:-0}"
"""


@pytest.fixture(scope="module")
def image(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with busybox_image(tmp_path_factory.mktemp("rootfs"), "localhost/gpcuser-img:1",
                       {"bin/torchrun": IMAGE_TORCHRUN}) as reference:
        yield reference


def bring_up(tmp: Path, *flags: str) -> Sandbox:
    sandbox = start_sandbox(tmp / "cluster.yaml", NAME, SUBNET, 3, "--user", USER, *flags)
    for node in sandbox.nodes:  # fresh servers behind a default-drop firewall
        sandbox.node_exec(node, FIREWALL)
    return sandbox


def none_left(sandbox: Sandbox, command_line: str) -> bool:
    """No process with exactly this command line, within 5 s (the nodes share the
    machine's process table)."""
    deadline = time.monotonic() + 5
    while sandbox.node_exec("node1", f"pgrep -f '^{command_line}$'", check=False
                            ).returncode == 0:
        if time.monotonic() > deadline:
            return False
        time.sleep(0.2)
    return True


def doctor(sandbox: Sandbox) -> dict[tuple[str, str], str]:
    found = gpucluster("doctor", "-i", str(sandbox.inventory), "--json", timeout=120)
    return {(r["check"], r["host"]): r["status"] for r in json.loads(found.stdout)["results"]}


def as_user(sandbox: Sandbox, node: str, command: str) -> str:
    """What the node user sees, run through SSH as the tool does."""
    done = gpucluster("run", "-i", str(sandbox.inventory), "-w", node, command)
    assert done.code == 0, done.stderr
    return "\n".join(line.split(": ", 1)[1] if ": " in line else ""
                     for line in done.stdout.splitlines())


@pytest.mark.parametrize("shared_home", [False, True], ids=["private-homes", "shared-home"])
def test_a_sudo_user_runs_the_whole_flow(tmp_path: Path, image: str,
                                         shared_home: bool) -> None:
    sandbox = bring_up(tmp_path, *(["--shared-home"] if shared_home else []))
    try:
        _whole_flow(sandbox, tmp_path, image, shared_home)
    finally:
        gpucluster("sandbox", "down", "--name", NAME)


def _whole_flow(sandbox: Sandbox, tmp: Path, image: str, shared_home: bool) -> None:
    inventory = str(sandbox.inventory)
    assert as_user(sandbox, "node1", "id -un").strip() == USER
    # doctor: what a fresh server behind a firewall lacks (peer names, the rendezvous
    # port, the ports between nodes), nothing about the user or its GPUs
    before = doctor(sandbox)
    failing = {check for (check, _), status in before.items() if status == "FAIL"}
    assert failing == {"name-resolution", "rendezvous-port", "peer-ports"}, before
    # xid: the kernel log is the user's to read only through sudo (dmesg_restrict=1)
    for check in ("sudo", "nvidia-smi", "gpu-count", "python", "torchrun", "torch", "xid"):
        assert {before[(check, n)] for n in sandbox.nodes} == {"OK"}, check
    # top reads the Xids the same way: counted (no Xid), not unknown (None)
    seen = gpucluster("top", "-i", inventory, "--once", "--json", timeout=60)
    assert seen.code == 0, seen.stderr
    assert {str(gpu["xid_errors"]) for node in seen.json()["nodes"]
            for gpu in node["gpus"]} == {"[]"}

    # provision: every step, the root ones through sudo, the image into root's engine
    with_image = sandbox.write_inventory(tmp / "with-image.yaml", cluster={
        **sandbox.data["cluster"], "image": image})
    done = gpucluster("provision", "-i", str(with_image), "--json", timeout=300)
    payload = json.loads(done.stdout)
    outcomes = {(r["step"], r["host"]): r["outcome"] for r in payload["results"]}
    assert done.code == 0, (outcomes, done.stderr)
    assert {o for (step, _), o in outcomes.items() if step != "smoke"} == {"changed"}
    assert {o for (step, _), o in outcomes.items() if step == "smoke"} == {"passed"}
    for node in sandbox.nodes:
        rules = sandbox.node_exec(node, "iptables -S INPUT").stdout
        assert len(re.findall(r"--comment gpucluster -j ACCEPT", rules)) == 2, rules
        assert "# BEGIN gpucluster" in sandbox.node_exec(node, "cat /etc/hosts").stdout
        assert sandbox.node_exec(node, f"podman image exists {image}", check=False
                                 ).returncode == 0
    again = gpucluster("provision", "-i", str(with_image), "--json", "--skip", "smoke")
    assert {r["outcome"] for r in json.loads(again.stdout)["results"]} == {"already ok"}
    after = doctor(sandbox)
    assert {s for s in after.values()} <= {"OK", "SKIP"}, after
    # A command under sudo that runs out of time is ended whole, root's processes too.
    timed = gpucluster("run", "-i", inventory, "--sudo", "-t", "2", "sleep 77")
    assert "timed out" in timed.stdout, timed.stdout
    assert none_left(sandbox, "sleep 77")

    # launch: 3 nodes x 2 processes, as the user, in the user's work dir
    project = tmp / "project"
    project.mkdir()
    shutil.copy(TRAIN, project / "train.py")
    ran = gpucluster("launch", "-i", inventory, "--nproc-per-node", "2", "train.py", "--",
                     "--epochs", "2", cwd=str(project), timeout=240)
    assert ran.code == 0, ran.stderr
    assert len(re.findall(r"rank \d/6 on node\d ready", ran.stdout)) == 6
    job = re.search(r"job (\S+): exited 0 on node\[1-3\]", ran.stderr)
    assert job, ran.stderr
    owners = as_user(sandbox, "node2", f"stat -c '%U %a' ~/gpucluster/jobs/{job[1]}/node2")
    assert owners.split() == [USER, "700"]
    if shared_home:  # one home: every node's files side by side, none overwritten
        listed = as_user(sandbox, "node1", f"ls ~/gpucluster/jobs/{job[1]}")
        assert listed.split() == sandbox.nodes
        for node in sandbox.nodes:
            log = as_user(sandbox, "node1", f"cat ~/gpucluster/jobs/{job[1]}/{node}/node.log")
            assert re.findall(r"rank \d/6 on (node\d) ready", log) == [node, node]

    # the pushed image, run by root's engine through sudo, as the user inside
    boxed = gpucluster("launch", "-i", str(with_image), "--container", "train.py",
                       cwd=str(project), timeout=120)
    assert boxed.code == 0, boxed.stdout + boxed.stderr
    code_dir = "~/gpucluster/project"
    assert re.search(rf"in container: pwd=/home/{USER}/gpucluster/project marker=\S+@node3",
                     boxed.stdout), boxed.stdout
    made = as_user(sandbox, "node3", f"stat -c %U {code_dir}/made-in-container")
    assert made.strip() == USER
    # stopped as the user, although root's engine runs it (its processes are not the
    # user's to see or signal): by name, through sudo
    running = gpucluster("launch", "-i", str(with_image), "--container", "-d", "--env",
                         "FAKE_SLEEP=300", "train.py", cwd=str(project), timeout=120)
    assert running.code == 0, running.stderr
    boxed_job = running.stdout.strip()
    containers = "podman ps -q --filter name=gpucluster-"
    deadline = time.monotonic() + 60
    while len(sandbox.node_exec("node2", containers).stdout.split()) != 1:
        assert time.monotonic() < deadline, "the container did not start"
        time.sleep(0.3)
    stopped = gpucluster("stop", "-i", inventory, boxed_job, "--grace", "2")
    assert stopped.code == 0, stopped.stdout + stopped.stderr
    assert f"job {boxed_job} stopped: nothing of it is left on node[1-3]" in stopped.stdout
    for node in sandbox.nodes:
        assert sandbox.node_exec(node, containers).stdout.strip() == ""

    # detached, listed, its logs, stopped: nothing of it left
    started = gpucluster("launch", "-i", inventory, "-d", "--nproc-per-node", "1",
                         "train.py", "--", "--epochs", "300", "--step-delay", "0.05",
                         cwd=str(project))
    assert started.code == 0, started.stderr
    detached = started.stdout.strip()
    try:
        listing = gpucluster("jobs", "-i", inventory, "--json").json()
        states = {n["state"] for j in listing["jobs"] if j["id"] == detached
                  for n in j["nodes"].values()}
        assert states == {"running"}, listing
        deadline = time.monotonic() + 90
        while "rank 2/3 on node3 ready" not in (logs := gpucluster(
                "logs", "-i", inventory, detached, "-w", "node3")).stdout:
            assert time.monotonic() < deadline, logs.stdout + logs.stderr
            time.sleep(0.5)
        # where each rank is, read by py-spy as the node user (beside the node python)
        looked = gpucluster("stacks", "-i", inventory, detached, "--json")
        assert looked.code == 0, looked.stdout + looked.stderr
        groups = looked.json()["stacks"]
        assert sorted(r for g in groups for r in g["ranks"]) == [0, 1, 2], groups
        assert all(g["where"].startswith("train.py line ") for g in groups), groups
        stopped = gpucluster("stop", "-i", inventory, detached, "--grace", "3")
        assert stopped.code == 0, stopped.stderr
        assert f"job {detached} stopped: nothing of it is left on node[1-3]" in stopped.stdout
    finally:
        gpucluster("stop", "-i", inventory, detached)
    logs = gpucluster("logs", "-i", inventory, detached, "-w", "node3")
    assert re.search(r"^\[node3/2\] rank 2/3 on node3 ready$", logs.stdout, re.MULTILINE)
    assert "stopped on node3" in logs.stderr
    leftovers = gpucluster("run", "-i", inventory, f"pgrep -a -u {USER} -f '[t]rain.py' || :")
    assert "train.py" not in leftovers.stdout


@pytest.mark.parametrize("sudo", ["none", "password"])
def test_a_user_without_sudo_gets_findings_and_a_refusal_that_changes_nothing(
        tmp_path: Path, image: str, sudo: str) -> None:
    """No sudo rule at all, or one that asks for a password (typed only with
    --ask-sudo-pass): the same finding and the same refusal; then the password typed."""
    sandbox = bring_up(tmp_path, "--sudo", sudo)
    try:
        found = doctor(sandbox)
        assert {found[("sudo", n)] for n in sandbox.nodes} == {"WARN"}
        assert {found[("nvidia-smi", n)] for n in sandbox.nodes} == {"OK"}
        restricted = Path("/proc/sys/kernel/dmesg_restrict").read_text().strip() == "1"
        assert {found[("xid", n)] for n in sandbox.nodes} == {  # neither way, if restricted
            "SKIP" if restricted else "OK"}
        seen = gpucluster("top", "-i", str(sandbox.inventory), "--once", "--json",
                          timeout=60)
        assert {str(gpu["xid_errors"]) for node in seen.json()["nodes"]
                for gpu in node["gpus"]} == {"None" if restricted else "[]"}
        watched = "cat /etc/hosts; ls -a /home/gcuser/.ssh; iptables -S INPUT"
        before = {n: sandbox.node_exec(n, watched).stdout for n in sandbox.nodes}
        refused = gpucluster("provision", "-i", str(sandbox.inventory), timeout=120)
        assert refused.code != 0
        message = _the_one_error(refused.stderr)
        assert re.search(r"provision changed nothing: hosts, firewall need root on "
                         r"node\[1-3\], where gcuser cannot sudo without a password .*"
                         r"--skip hosts,firewall", message), message
        assert {n: sandbox.node_exec(n, watched).stdout for n in sandbox.nodes} == before
        sudoers = sandbox.node_exec("node1", "cat /etc/sudoers.d/gpucluster-sandbox",
                                    check=False).stdout
        assert ("gcuser ALL=(ALL) ALL" in sudoers) == (sudo == "password")
        if sudo == "password":
            _typed_sudo_password(sandbox, tmp_path, image, watched, before)
            # The rule the refusal names works beside a sudoers file that asks a password
            # (the sandbox's own, which sorts after a file named plain "gpucluster").
            fix = re.search(r"echo '([^']+)' \| sudo tee (\S+) on those nodes", message)
            assert fix, message
            for node in sandbox.nodes:
                sandbox.node_exec(node, f"echo '{fix[1]}' > {fix[2]} && chmod 440 {fix[2]}")
            assert {doctor(sandbox)[("sudo", n)] for n in sandbox.nodes} == {"OK"}
    finally:
        gpucluster("sandbox", "down", "--name", NAME)


def _reads_as_root_with_the_password(sandbox: Sandbox, tmp: Path,
                                     typed: Callable[..., CliResult]) -> None:
    """doctor and bundle read what only root may (the kernel log, the firewall) through
    the password typed; a wrong one is tried once and said so."""
    inventory = str(sandbox.inventory)
    checked = typed("doctor", "-i", inventory, "--json", "--only", "sudo,xid")
    found = {(r["check"], r["host"]): r["status"] for r in checked.json()["results"]}
    assert set(found.values()) == {"OK"}, checked.stdout  # xid: the kernel log was read
    refused = typed("doctor", "-i", inventory, "--json", "--only", "sudo,xid",
                    answer="not-it").json()["results"]
    assert {r["message"].split(" (")[0] for r in refused if r["check"] == "sudo"} == {
        "sudo refused the password typed"}, refused
    restricted = Path("/proc/sys/kernel/dmesg_restrict").read_text().strip() == "1"
    assert {r["status"] for r in refused if r["check"] == "xid"} == {  # not read with it
        "SKIP" if restricted else "OK"}, refused
    seen = typed("top", "-i", inventory, "--once", "--json")
    assert {str(gpu["xid_errors"]) for node in seen.json()["nodes"]
            for gpu in node["gpus"]} == {"[]"}  # counted: none, where untyped says None

    def firewall_collected(*how: str) -> str:
        out = tmp / f"bundle{len(how)}"
        out.mkdir()
        done = (typed if how else gpucluster)("bundle", "-i", inventory, "-w", "node1",
                                               "-o", str(out))
        assert done.code == 0, done.stderr
        with tarfile.open(next(out.glob("*.tar.gz"))) as archive:
            member = next(m for m in archive.getnames() if m.endswith("node1/firewall.txt"))
            return archive.extractfile(member).read().decode()  # type: ignore[union-attr]

    assert "--comment gpucluster" not in firewall_collected()  # iptables-save needs root
    assert "--comment gpucluster -j ACCEPT" in firewall_collected("typed")
    wrong = typed("bundle", "-i", inventory, answer="not-it")
    assert wrong.code == 2 and "bundle collected nothing: sudo refused" in wrong.stderr


def _reaps_a_root_process(sandbox: Sandbox, typed: Callable[..., CliResult]) -> None:
    """A root process on a GPU is another user's to gcuser: reap ends it through sudo
    only with the password typed, never reports it ended when it was not."""
    holder = subprocess.Popen(sandbox.node_argv("node2", ["sleep", "301"]))
    try:
        time.sleep(0.2)
        apps = Path(f"/var/lib/gpucluster/sandbox/{NAME}/node2/gpu.apps")
        apps.write_text(f"{holder.pid} 3 2048 python stray.py\n")
        reap = ("reap", "-i", str(sandbox.inventory), "-w", "node2", "--yes", "--foreign",
                "--grace", "1")
        untyped = gpucluster(*reap)
        assert untyped.code == 1 and "LEFT: not ended" in untyped.stderr and \
            "gcuser's sudo asks a password (fix: reap --yes --foreign --ask-sudo-pass)" in \
            untyped.stderr, untyped.stderr
        wrong = typed(*reap, answer="not-it")
        assert wrong.code == 2 and "reap ended nothing: sudo refused gcuser's password " \
            "on node2" in wrong.stderr, wrong.stderr
        assert holder.poll() is None
        ended = typed(*reap)
        assert ended.code == 0 and "freed 2048 MiB" in ended.stderr, ended.stderr
        assert holder.wait(timeout=10) != 0  # ended by a signal
    finally:
        holder.kill()
        holder.wait()


def _the_one_error(stderr: str) -> str:
    """A refusal's one-line error, after the progress lines of the steps run before it
    (provision's `gpucluster: parity: ...`), and nothing else."""
    *progress, message = stderr.strip().splitlines()
    assert message.startswith("gpucluster: error: ") and "Traceback" not in stderr, stderr
    assert all(line.startswith("gpucluster: ") and "error" not in line
               for line in progress), stderr
    return message


def _typed_sudo_password(sandbox: Sandbox, tmp: Path, image: str, watched: str,
                         before: dict[str, str]) -> None:
    """--ask-sudo-pass: a wrong password is tried once per node and changes nothing; the
    right one provisions every step through sudo (the relay's `podman load` too) and runs
    `run --sudo`; it shows nowhere: the output, the command log, a command line."""
    password = Path(f"/var/lib/gpucluster/sandbox/{NAME}/sudo-password").read_text().strip()
    inventory = str(sandbox.inventory)
    seen: list[str] = []

    def typed(command: str, *args: str, answer: str = password) -> CliResult:
        # Right after the command's name: run's own options go before its COMMAND
        done = gpucluster(command, "--ask-sudo-pass", *args, stdin=f"{answer}\n",
                          timeout=300)
        seen.extend((done.stdout, done.stderr))
        return done

    wrong = typed("provision", "-i", inventory, answer="not-the-password")
    assert wrong.code == 2 and _the_one_error(wrong.stderr), wrong.stderr
    assert re.search(r"provision changed nothing: hosts, firewall need root on node\[1-3\], "
                     r"where sudo refused gcuser's password \(.*; tried once per node\)",
                     wrong.stderr), wrong.stderr
    assert {n: sandbox.node_exec(n, watched).stdout for n in sandbox.nodes} == before
    refused = typed("run", "-i", inventory, "--sudo", "touch /gpc-ran", answer="nope")
    assert refused.code == 2 and "nothing ran: sudo refused gcuser's password on " \
        "node[1-3]" in refused.stderr, refused.stderr
    assert sandbox.node_exec("node1", "test -e /gpc-ran", check=False).returncode == 1
    assert "fix: add --sudo" in gpucluster("run", "-i", inventory, "--ask-sudo-pass",
                                           "true").stderr
    untyped = gpucluster("run", "-i", inventory, "--sudo", "touch /gpc-ran")
    assert untyped.code == 1 and "(fix: sudo asks a password on node[1-3]: add " \
        "--ask-sudo-pass)" in untyped.stderr, untyped.stderr

    with_image = sandbox.write_inventory(tmp / "with-image.yaml", cluster={
        **sandbox.data["cluster"], "image": image})
    done = typed("provision", "-i", str(with_image), "--skip", "smoke", "--json")
    assert done.code == 0, done.stderr
    outcomes = {(r["step"], r["host"]): r["outcome"] for r in json.loads(done.stdout)["results"]}
    assert set(outcomes.values()) == {"changed"}, outcomes
    for node in sandbox.nodes:
        assert "# BEGIN gpucluster" in sandbox.node_exec(node, "cat /etc/hosts").stdout
        assert "--comment gpucluster" in sandbox.node_exec(node, "iptables -S INPUT").stdout
        assert sandbox.node_exec(node, f"podman image exists {image}", check=False
                                 ).returncode == 0  # root's engine, loaded through sudo
    _reads_as_root_with_the_password(sandbox, tmp, typed)
    # As root, with every process's command line at that moment (sudo's among them).
    ran = typed("run", "-i", inventory, "--sudo", "--json",
                "id -u; cat /proc/[0-9]*/cmdline 2>/dev/null | tr '\\0' ' '")
    assert ran.code == 0, ran.stderr
    assert [h["stdout"].split("\n", 1)[0] for h in ran.json()["hosts"]] == ["0"] * 3
    timed = typed("run", "-i", inventory, "--sudo", "-t", "2", "sleep 78")
    assert "timed out" in timed.stdout and none_left(sandbox, "sleep 78"), timed.stdout
    _reaps_a_root_process(sandbox, typed)
    # A container job runs root's engine through sudo -n: refused, naming the rule that
    # lets it, until that rule is there.
    project = tmp / "boxed"
    project.mkdir()
    shutil.copy(TRAIN, project / "train.py")
    boxed = ("launch", "-i", str(with_image), "--container", "train.py")
    refused = gpucluster(*boxed, cwd=str(project), timeout=120)
    rule = f"{USER} ALL=(root) NOPASSWD:SETENV: /usr/bin/podman"
    assert refused.code == 2 and "sudo asks a password, which a job cannot type" in \
        refused.stderr and f"echo '{rule}' | sudo tee /etc/sudoers.d/zz-gpucluster-engine" \
        in refused.stderr, refused.stderr
    for node in sandbox.nodes:
        sandbox.node_exec(node, f"echo '{rule}' > /etc/sudoers.d/zz-gpucluster-engine && "
                                f"chmod 440 /etc/sudoers.d/zz-gpucluster-engine")
    ran_boxed = gpucluster(*boxed, cwd=str(project), timeout=120)
    assert ran_boxed.code == 0 and ran_boxed.stdout.count("in container: pwd=") == 3, \
        ran_boxed.stderr
    assert all("sudo -A" in h["stdout"] for h in ran.json()["hosts"])  # lines were read
    logs = (sandbox.inventory.parent / ".gpucluster" / "logs").glob("provision-*.log")
    for text in [*seen, *(log.read_text() for log in logs)]:
        assert password not in text
