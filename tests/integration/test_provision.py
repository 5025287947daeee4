"""Provision on its own 3-node sandbox: real effects inside the nodes, idempotence by
file mtimes, a firewall that admits peers and not an outsider, undo, and a node that
dies in the middle of a run."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shlex
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpucluster import hostrange
from tests.cli import gpucluster
from tests.sandbox import Sandbox, busybox_image, start_sandbox

pytestmark = pytest.mark.sandbox

NAME, SUBNET = "gpcprov", "198.19.2.0/24"
OUTSIDER = "gpcprov-outsider"
FIREWALL = ("iptables -A INPUT -i lo -j ACCEPT; iptables -A INPUT -m conntrack --ctstate "
            "ESTABLISHED,RELATED -j ACCEPT; iptables -A INPUT -p tcp --dport 22 -j ACCEPT; "
            "iptables -P INPUT DROP")
WATCHED = "/etc/hosts /root/.ssh/authorized_keys /root/.ssh/known_hosts /root/.ssh/config " \
          "/root/.ssh/gpucluster_ed25519"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sandbox]:
    sandbox = start_sandbox(tmp_path_factory.mktemp("provision") / "cluster.yaml", NAME,
                            SUBNET, 3)
    for node in sandbox.nodes:  # a real firewall: default drop, SSH allowed
        sandbox.node_exec(node, f"{FIREWALL}; echo '10.9.9.9 keep-me' >> /etc/hosts")
    try:
        yield sandbox
    finally:
        gpucluster("sandbox", "down", "--name", NAME)


def _provision(sandbox: Sandbox, *args: str) -> tuple[int, dict]:
    result = gpucluster("provision", "-i", str(sandbox.inventory), "--json", *args,
                        timeout=180)
    return result.code, json.loads(result.stdout) if result.stdout.strip() else {}


def _outcomes(payload: dict) -> dict[tuple[str, str], str]:
    return {(r["step"], r["host"]): r["outcome"] for r in payload["results"]}


def _without_image(payload: dict) -> set[str]:
    """Outcomes of the steps that change nodes, but `image`, which this inventory leaves
    out (skipped); the smoke test, which changes nothing, is checked apart."""
    outcomes = _outcomes(payload)
    assert {o for (step, _), o in outcomes.items() if step == "image"} == {"skipped"}
    return {o for (step, _), o in outcomes.items() if step not in ("image", "smoke")}


def _ssh_mesh(sandbox: Sandbox) -> dict[str, dict]:
    """doctor's ssh-mesh finding on each node."""
    done = gpucluster("doctor", "-i", str(sandbox.inventory), "--only", "ssh-mesh", "--json")
    return {r["host"]: r for r in json.loads(done.stdout)["results"]}


def _mtimes(sandbox: Sandbox) -> dict[str, str]:
    return {node: sandbox.node_exec(node, f"stat -c '%n %Y.%y' {WATCHED}", check=False).stdout
            for node in sandbox.nodes}


def test_dry_run_shows_diffs_and_rules_and_changes_nothing(cluster: Sandbox) -> None:
    before = _mtimes(cluster)
    code, payload = _provision(cluster, "--dry-run")
    assert code == 0
    assert _without_image(payload) == {"would change"}
    changes = {(r["step"], r["host"]): r["changes"] for r in payload["results"]}
    hosts_diff = changes[("hosts", "node1")][0]["detail"]
    assert "+198.19.2.12\tnode2" in hosts_diff and "--- /etc/hosts (now)" in hosts_diff
    rules = changes[("firewall", "node1")][0]["detail"]
    assert changes[("firewall", "node1")][0]["summary"] == "2 iptables rule commands"
    assert "iptables -I INPUT -s 198.19.2.12/32 -p tcp -m multiport --dports 29500," in rules
    assert _mtimes(cluster) == before
    # Before the mesh, no node logs in to the next: one finding for all, one pair named.
    found = _ssh_mesh(cluster)
    assert {r["status"] for r in found.values()} == {"WARN"}, found
    assert len({r["message"] for r in found.values()}) == 1
    assert found["node3"]["message"].startswith(
        "no node logs in to the next over SSH (node1 to node2: ssh: Could not resolve "
        "hostname node2"), found
    assert found["node3"]["remedy"].startswith("gpucluster provision --only ssh-mesh")


def test_provision_then_a_second_run_changes_nothing(cluster: Sandbox) -> None:
    code, payload = _provision(cluster)
    assert code == 0, payload
    assert _without_image(payload) == {"changed"}
    # The last step: an all-reduce through torchrun across the freshly provisioned nodes
    # (names resolve, the firewall admits peers), which would fail before provision.
    smoke = {r["host"]: r for r in payload["results"] if r["step"] == "smoke"}
    assert {r["outcome"] for r in smoke.values()} == {"passed"}, smoke
    assert "gloo all-reduce correct" in smoke["node1"]["message"]
    assert payload["ssh_mesh"] == {n: {p: "ok" for p in cluster.nodes if p != n}
                                   for n in cluster.nodes}
    log = Path(payload["log"])
    assert log.is_file() and "iptables -I INPUT" in log.read_text()
    assert "BEGIN OPENSSH PRIVATE KEY" not in log.read_text()
    state = log.parent.parent
    assert (state / "gpucluster_ed25519").stat().st_mode & 0o777 == 0o600
    assert state.stat().st_mode & 0o777 == 0o700

    before = _mtimes(cluster)
    code, again = _provision(cluster)
    assert code == 0
    assert _without_image(again) == {"already ok"}
    assert _mtimes(cluster) == before  # nothing was written
    assert again["ssh_mesh"] == {}  # nothing changed: the pairs are not tested again...
    code, verified = _provision(cluster, "--only", "ssh-mesh", "--verify")
    assert code == 0 and verified["ssh_mesh"] == payload["ssh_mesh"]  # ...unless asked

    # A private key someone made readable is made private again, nothing else changes.
    key = "/root/.ssh/gpucluster_ed25519"
    cluster.node_exec("node2", f"chmod 644 {key}")
    code, fixed = _provision(cluster, "--only", "ssh-mesh")
    assert code == 0 and _outcomes(fixed)[("ssh-mesh", "node2")] == "changed"
    assert _outcomes(fixed)[("ssh-mesh", "node1")] == "already ok"
    assert cluster.node_exec("node2", f"stat -c %a {key}").stdout.strip() == "600"


def test_every_node_reaches_every_peer_with_verified_keys(cluster: Sandbox) -> None:
    for node in cluster.nodes:
        for peer in cluster.nodes:
            done = cluster.node_exec(node, f"ssh -o BatchMode=yes -o StrictHostKeyChecking=yes"
                                           f" {peer} hostname", check=False)
            assert done.stdout.strip() == peer, (node, peer, done.stderr)
        authorized = cluster.node_exec(node, "cat /root/.ssh/authorized_keys").stdout
        addresses = ",".join(cluster.addresses.values())
        assert f'from="{addresses}" ssh-ed25519 ' in authorized  # usable from peers only
        known = cluster.node_exec(node, "cat /root/.ssh/known_hosts").stdout
        assert "StrictHostKeyChecking=no" not in cluster.node_exec(
            node, "cat /root/.ssh/config").stdout
        for peer, address in cluster.addresses.items():
            key = Path(f"/var/lib/gpucluster/sandbox/{NAME}/{peer}/etc/ssh/"
                       f"ssh_host_ed25519_key.pub").read_text().split()[1]
            assert any(line.startswith(f"{peer},") and address in line and key in line
                       for line in known.splitlines())


def test_the_pair_test_names_a_pair_that_cannot_log_in(cluster: Sandbox) -> None:
    # node3 refuses SSH from node2 only: the mesh's files are all right, so only the
    # verification can see it (a login, not a remote command: no shell runs).
    source = cluster.addresses["node2"]
    reject = f"INPUT -s {source} -p tcp --dport 22 -j REJECT --reject-with tcp-reset"
    cluster.node_exec("node3", f"iptables -I {reject}")
    try:
        code, payload = _provision(cluster, "--only", "ssh-mesh", "--verify")
        found = _ssh_mesh(cluster)  # doctor's ring: node2 logs in to node3
    finally:
        cluster.node_exec("node3", f"iptables -D {reject}")
    assert {n: r["status"] for n, r in found.items()} == {
        "node1": "OK", "node2": "WARN", "node3": "OK"}, found
    assert found["node2"]["message"].startswith(
        f"cannot log in to node3 over SSH (ssh: connect to host {cluster.addresses['node3']} "
        f"port 22: Connection refused)"), found["node2"]
    matrix = payload["ssh_mesh"]
    assert matrix["node2"]["node3"] == "fail" and code == 1, payload
    assert {(a, b) for a, row in matrix.items() for b, v in row.items() if v != "ok"} == {
        ("node2", "node3")}
    code, payload = _provision(cluster, "--only", "ssh-mesh", "--verify")
    assert code == 0 and payload["ssh_mesh"]["node2"]["node3"] == "ok"
    # The pair test's own masters only: sandbox nodes share one process table, where
    # other masters (the image relay's) may be.
    left = cluster.node_exec("node2", "ps -eo args | grep -c '[C]ontrolPersist=5 -fN' || true")
    assert left.stdout.strip() == "0"  # every test login closed


def test_a_second_cluster_on_the_same_nodes_keeps_apart(cluster: Sandbox,
                                                       tmp_path: Path) -> None:
    """The same nodes in a second inventory with its own cluster.name: its provision and
    its undo leave the first cluster's key, blocks and firewall rules alone; undone, the
    second leaves every file as it found it."""
    settings = {**cluster.data["cluster"], "name": "second"}
    second = cluster.write_inventory(tmp_path / "second.yaml", cluster=settings)
    first_rules = cluster.node_exec("node2", "iptables -S INPUT").stdout
    assert "--comment gpucluster" in first_rules  # the first cluster is provisioned
    fingerprint = "md5sum /etc/hosts /root/.ssh/*"
    first_files = {node: cluster.node_exec(node, fingerprint).stdout for node in cluster.nodes}
    try:
        done = gpucluster("provision", "-i", str(second), "--json", "--only",
                          "ssh-mesh,hosts,firewall", timeout=180)
        assert done.code == 0, done.stdout + done.stderr
        hosts = cluster.node_exec("node2", "cat /etc/hosts").stdout
        assert "# BEGIN gpucluster managed block" in hosts
        assert "# BEGIN second managed block" in hosts
        keys = cluster.node_exec("node2", "ls /root/.ssh").stdout.split()
        assert {"gpucluster_ed25519", "second_ed25519"} <= set(keys)
        assert "--comment second" in cluster.node_exec("node2", "iptables -S INPUT").stdout
        undone = gpucluster("provision", "-i", str(second), "--undo", "firewall")
        assert undone.code == 0, undone.stderr
        assert cluster.node_exec("node2", "iptables -S INPUT").stdout == first_rules
        nodes = hostrange.fold(cluster.nodes)
        for step, said in (("hosts", "1 file cleaned"), ("ssh-mesh", "5 files cleaned")):
            undone = gpucluster("provision", "-i", str(second), "--undo", step)
            assert undone.stdout == f"{nodes} {step}: changed ({said})\n", undone.stderr
        # The key, its authorized_keys line and the three blocks are gone, byte for byte.
        assert {node: cluster.node_exec(node, fingerprint).stdout
                for node in cluster.nodes} == first_files
        code, payload = _provision(cluster, "--only", "ssh-mesh,hosts,firewall")
        assert code == 0 and set(_outcomes(payload).values()) == {"already ok"}, payload
    finally:
        for node in cluster.nodes:
            cluster.node_exec(node, "sed -i '/BEGIN second managed/,/END second managed/d' "
                                    "/etc/hosts /root/.ssh/config /root/.ssh/known_hosts; "
                                    "sed -i '/second-cluster/d' /root/.ssh/authorized_keys; "
                                    "rm -f /root/.ssh/second_ed25519*", check=False)


def test_hosts_block_is_right_and_other_lines_are_intact(cluster: Sandbox) -> None:
    hosts = cluster.node_exec("node2", "cat /etc/hosts").stdout.splitlines()
    start = hosts.index(next(line for line in hosts if line.startswith("# BEGIN gpucluster")))
    assert hosts[start + 1:start + 4] == [f"{a}\t{n}" for n, a in cluster.addresses.items()]
    assert "10.9.9.9 keep-me" in hosts and "127.0.0.1\tlocalhost" in hosts
    resolved = cluster.node_exec("node2", "getent hosts node3").stdout.split()[0]
    assert resolved == cluster.addresses["node3"]


def test_a_hostile_or_cloned_hostname_never_reaches_the_nodes_files(cluster: Sandbox) -> None:
    try:
        cluster.node_exec("node3", "hostname localhost")  # inside node3's own UTS namespace
        cluster.node_exec("node2", "hostname node1")  # another inventory host's name
        code, payload = _provision(cluster, "--only", "hosts,ssh-mesh")
        assert code == 0, payload
        notes = {(r["step"], r["host"]): r["message"] for r in payload["results"]}
        assert "is a loopback name" in notes[("hosts", "node3")]
        assert "another inventory host's name" in notes[("ssh-mesh", "node2")]
        for node in cluster.nodes:
            hosts = cluster.node_exec(node, "cat /etc/hosts").stdout
            block = hosts[hosts.index("BEGIN gpucluster"):hosts.index("END gpucluster")]
            assert "localhost" not in block and block.split().count("node1") == 1, (node, block)
            config = cluster.node_exec(node, "cat /root/.ssh/config").stdout
            assert "Host node3 localhost" not in config
    finally:
        cluster.node_exec("node3", "hostname node3")
        cluster.node_exec("node2", "hostname node2")
    code, payload = _provision(cluster, "--only", "hosts,ssh-mesh")
    assert code == 0 and not any(r["message"] for r in payload["results"])


@pytest.fixture
def outsider(cluster: Sandbox) -> Iterator[list[str]]:
    """A namespace on the sandbox bridge that is not in the inventory."""
    for command in (f"ip netns add {OUTSIDER}",
                    f"ip link add {NAME}-out type veth peer name eth0 netns {OUTSIDER}",
                    f"ip link set {NAME}-out master {NAME}-br up",
                    f"ip -n {OUTSIDER} addr add 198.19.2.250/24 dev eth0",
                    f"ip -n {OUTSIDER} link set eth0 up"):
        subprocess.run(command.split(), check=True)
    yield ["ip", "netns", "exec", OUTSIDER]
    subprocess.run(["ip", "netns", "del", OUTSIDER], check=False)
    subprocess.run(["ip", "link", "del", f"{NAME}-out"], check=False, capture_output=True)


CONNECT = ("import socket,sys\ntry:\n socket.create_connection(('198.19.2.11',29500),"
           "timeout=2).close(); print('open')\nexcept OSError as e: print('closed', e)")


def test_rendezvous_port_open_to_peers_not_to_an_outsider(cluster: Sandbox,
                                                         outsider: list[str]) -> None:
    listener = subprocess.Popen(cluster.node_argv("node1", [
        sys.executable, "-c", "import socket,time\ns=socket.socket()\n"
        "s.setsockopt(socket.SOL_SOCKET,socket.SO_REUSEADDR,1)\ns.bind(('0.0.0.0',29500))\n"
        "s.listen(8)\ns.settimeout(15)\nwhile True:\n c,_=s.accept(); c.close()"]))
    try:
        time.sleep(0.5)
        peer = cluster.node_exec("node2", f"{sys.executable} -c \"{CONNECT}\"").stdout
        stranger = subprocess.run([*outsider, sys.executable, "-c", CONNECT],
                                  capture_output=True, text=True, timeout=30, check=False).stdout
    finally:
        listener.kill()
        listener.wait()
    assert peer.strip() == "open"
    assert stranger.startswith("closed")


def test_side_by_side_rendezvous_ports_open_to_peers_not_to_an_outsider(
        cluster: Sandbox, outsider: list[str]) -> None:
    """cluster.rendezvous_ports 8 (launch --gpus, jobs side by side): a job on GPU 4 and
    up takes port 29504, which the firewall opens to peers alone; set back to one port,
    the rules shut it again."""
    wide = cluster.write_inventory(cluster.inventory.parent / "side-by-side.yaml",
                                   cluster={**cluster.data["cluster"], "rendezvous_ports": 8})
    try:
        done = gpucluster("provision", "-i", str(wide), "--only", "firewall")
        assert done.code == 0, done.stderr
        rules = cluster.node_exec("node1", "iptables -S INPUT").stdout
        assert "--dports 29500,29501:29507,32768:60999 " in rules, rules
        assert _reaches(cluster, "node2", "node1", 29504)
        cluster.node_exec("node1", f"setsid timeout 15 {sys.executable} -c \"import socket; "
                                   f"s = socket.socket(); s.bind(('', 29504)); s.listen(); "
                                   f"s.accept()\" >/dev/null 2>&1 < /dev/null &")
        time.sleep(0.5)
        stranger = subprocess.run([*outsider, sys.executable, "-c",
                                   CONNECT.replace("29500", "29504")],
                                  capture_output=True, text=True, timeout=30, check=False)
        _kill_in_node(cluster, "node1", b"s.listen()")
        assert stranger.stdout.startswith("closed"), stranger.stdout
    finally:
        narrow = gpucluster("provision", "-i", str(cluster.inventory), "--only", "firewall")
    assert narrow.code == 0, narrow.stderr
    assert "29501:29507" not in cluster.node_exec("node1", "iptables -S INPUT").stdout
    assert not _reaches(cluster, "node2", "node1", 29504)


def test_undo_firewall_restores_the_ruleset(cluster: Sandbox) -> None:
    with_ours = cluster.node_exec("node1", "iptables -S INPUT").stdout
    assert "--comment gpucluster" in with_ours
    done = gpucluster("provision", "-i", str(cluster.inventory), "--undo", "firewall")
    assert done.code == 0, done.stderr
    # Said once for every node, in the inventory's order.
    assert re.fullmatch(rf"{re.escape(hostrange.fold(cluster.nodes))} firewall: changed "
                        rf"\(\d+ commands\)\n", done.stdout), done.stdout
    again = gpucluster("provision", "-i", str(cluster.inventory), "--undo", "firewall")
    assert again.stdout == f"{hostrange.fold(cluster.nodes)} firewall: already ok (nothing " \
                           f"of the firewall step's to remove)\n", again.stdout
    after = cluster.node_exec("node1", "iptables -S INPUT").stdout
    original = [line for line in with_ours.splitlines() if "gpucluster" not in line]
    assert after.splitlines() == original
    assert "-p tcp -m tcp --dport 22 -j ACCEPT" in after  # SSH never touched
    code, payload = _provision(cluster, "--only", "firewall")  # back for later tests
    assert code == 0 and set(_outcomes(payload).values()) == {"changed"}


def test_a_node_dying_mid_run_fails_alone_and_a_rerun_completes(cluster: Sandbox) -> None:
    for node in cluster.nodes:  # undo the hosts block so that there is work to do
        cluster.node_exec(node, "sed -i '/BEGIN gpucluster/,/END gpucluster/d' /etc/hosts")
    logs = Path(cluster.inventory).parent / ".gpucluster" / "logs"
    seen = set(logs.iterdir())
    process = subprocess.Popen(
        [sys.executable, "-m", "gpucluster", "provision", "-i", str(cluster.inventory),
         "--json", "--skip", "parity"], stdout=subprocess.PIPE, text=True)
    deadline = time.time() + 60
    killed = False
    while time.time() < deadline and not killed:  # wait until the run reaches /etc/hosts
        for log in set(logs.iterdir()) - seen:
            if re.search(r"node3: (\[sudo\] )?'# Print /etc/hosts",  # read_file.sh.j2
                         log.read_text()):
                namespace_pids = subprocess.run(["ip", "netns", "pids", f"{NAME}-node3"],
                                                capture_output=True, text=True,
                                                check=False).stdout.split()
                for pid in namespace_pids:
                    subprocess.run(["kill", "-KILL", pid], check=False)
                killed = True
        time.sleep(0.05)
    output, _ = process.communicate(timeout=120)
    assert killed
    payload = json.loads(output)
    outcomes = _outcomes(payload)
    assert process.returncode == 1
    assert outcomes[("hosts", "node3")] == "failed"
    assert outcomes[("hosts", "node1")] == "changed" and outcomes[("hosts", "node2")] == "changed"

    cluster.restage()  # node3 comes back (same keys, same files)
    code, again = _provision(cluster, "--skip", "parity")
    outcomes = _outcomes(again)
    assert code == 0, again
    assert outcomes[("hosts", "node3")] == "changed"
    assert outcomes[("hosts", "node1")] == "already ok"


def test_a_node_that_does_not_answer_fails_every_step_after_one_wait(cluster: Sandbox
                                                                     ) -> None:
    cluster.node_exec("node3", "iptables -I INPUT -p tcp --dport 22 -j DROP")
    try:
        code, payload = _provision(cluster, "--only", "ssh-mesh,hosts,firewall",
                                   "--connect-timeout", "2")
    finally:
        cluster.node_exec("node3", "iptables -D INPUT -p tcp --dport 22 -j DROP")
    assert code == 1, payload
    node3 = {r["step"]: r["message"] for r in payload["results"] if r["host"] == "node3"}
    assert set(node3) == {"ssh-mesh", "hosts", "firewall"}
    assert all(m.startswith("unreachable: no answer from") for m in node3.values()), node3
    assert {o for (_, host), o in _outcomes(payload).items() if host != "node3"} <= \
        {"already ok", "changed"}  # the others are provisioned all the same
    # Not dialled again by each step, nor from every peer by the pair test: one attempt
    assert payload["ssh_mesh"]["node1"]["node3"] == "unreachable"
    attempts = [line for line in Path(payload["log"]).read_text().splitlines()
                if " node3: " in line]
    assert len(attempts) == 1 and "unreachable" in attempts[0], attempts


def test_parity_gate_stops_on_a_mismatch_unless_forced(cluster: Sandbox) -> None:
    cluster.restage("--driver", "node2=535.104.05")
    try:
        for node in cluster.nodes:  # leave work to do, to prove the gate changes nothing
            cluster.node_exec(node, "sed -i '/BEGIN gpucluster/,/END gpucluster/d' /etc/hosts")
        before = _mtimes(cluster)
        code, payload = _provision(cluster)
        assert code == 1 and payload["gate_blocked"] is True
        assert {(g["check"], g["host"]) for g in payload["gate"]} == {("driver", "node2")}
        assert payload["results"] == []
        assert _mtimes(cluster) == before
        human = gpucluster("provision", "-i", str(cluster.inventory))
        assert "Parity gate" in human.stdout and "--force" in human.stdout
        assert "535.104.05" in human.stdout
        code, forced = _provision(cluster, "--force")
        assert code == 0 and _outcomes(forced)[("hosts", "node2")] == "changed"
    finally:
        cluster.restage()
    # The nodes' CPU build of torch where jobs would use the GPUs: one finding a node
    # (torch-build's), not torch-cuda's and nccl's besides.
    on_gpus = cluster.write_inventory(cluster.inventory.parent / "cpu-torch.yaml", defaults={
        **cluster.data["defaults"], "torch_device": "cuda"})
    stopped = gpucluster("provision", "-i", str(on_gpus), "--json", "--only", "parity,hosts",
                         timeout=180)
    payload = json.loads(stopped.stdout)
    assert stopped.code == 1 and payload["gate_blocked"] is True, payload
    assert {(g["check"], g["host"]) for g in payload["gate"]} == {
        ("torch-build", node) for node in cluster.nodes}, payload["gate"]


@pytest.fixture(scope="module")
def image(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real podman image in the controller's storage: busybox and 8 MB of noise."""
    noise = {"noise": os.urandom(8 * 1024 * 1024)}
    with busybox_image(tmp_path_factory.mktemp("rootfs"), "localhost/gpcprov-test:1",
                       noise) as reference:
        yield reference


def test_image_reaches_every_nodes_own_storage_then_skips(cluster: Sandbox, image: str
                                                         ) -> None:
    expected = subprocess.run(["podman", "image", "inspect", "--format", "{{.Id}}", image],
                              capture_output=True, text=True, check=True).stdout.strip()
    # Beside the cluster's inventory, so that it shares its state (the cluster key).
    inventory = cluster.write_inventory(cluster.inventory.parent / "image.yaml",
                                        cluster={**cluster.data["cluster"], "image": image})
    result = gpucluster("provision", "-i", str(inventory), "--json", "--only",
                        "ssh-mesh,image", timeout=300)
    payload = json.loads(result.stdout)
    assert result.code == 0, payload
    assert {o for (step, _), o in _outcomes(payload).items() if step == "image"} == {"changed"}
    for node in cluster.nodes:
        found = cluster.node_exec(node, f"podman image inspect --format '{{{{.Id}}}}' {image}")
        assert found.stdout.strip() == expected
        storage = Path(f"/var/lib/gpucluster/sandbox/{NAME}/{node}/containers")
        assert any(storage.rglob("*")), f"{node} has no image in its own storage"
    work_dir = cluster.data["cluster"].get("work_dir", "~/gpucluster")
    assert cluster.node_exec("node2", f"ls -d {work_dir}").returncode == 0
    leftovers = cluster.node_exec("node2", f"ls -d {work_dir}/.relay-* 2>/dev/null || true")
    assert leftovers.stdout.strip() == ""  # relay scripts, fifo and control socket removed

    again = gpucluster("provision", "-i", str(inventory), "--json", "--only", "image")
    assert set(_outcomes(json.loads(again.stdout)).values()) == {"already ok"}


def test_an_apptainer_image_file_reaches_every_node_then_skips(cluster: Sandbox) -> None:
    # A .sif is not loaded into a runtime: nodes keep the file, checked by its sha256.
    image = cluster.inventory.parent / "train.sif"
    image.write_bytes(os.urandom(3 * 1024 * 1024))
    inventory = cluster.write_inventory(cluster.inventory.parent / "sif.yaml",
                                        cluster={**cluster.data["cluster"], "image": "train.sif"})

    def push() -> dict[tuple[str, str], str]:
        result = gpucluster("provision", "-i", str(inventory), "--json", "--only",
                            "ssh-mesh,image", timeout=300)
        assert result.code == 0, result.stdout + result.stderr
        return {node: o for (step, node), o in _outcomes(json.loads(result.stdout)).items()
                if step == "image"}

    def held() -> set[str]:
        return {cluster.node_exec(node, "sha256sum /srv/gpucluster/images/train.sif; ls "
                                        "/srv/gpucluster/images").stdout for node in cluster.nodes}

    assert set(push().values()) == {"changed"}
    digest = hashlib.sha256(image.read_bytes()).hexdigest()
    assert held() == {f"{digest}  /srv/gpucluster/images/train.sif\ntrain.sif\n"
                      f"train.sif.sha256\n"}  # no partial file left behind
    assert set(push().values()) == {"already ok"}
    image.write_bytes(os.urandom(1024 * 1024))  # a new version goes out again
    assert set(push().values()) == {"changed"}
    assert held() == {f"{hashlib.sha256(image.read_bytes()).hexdigest()}  "
                      f"/srv/gpucluster/images/train.sif\ntrain.sif\ntrain.sif.sha256\n"}


def test_a_hop_that_cannot_reach_the_next_stops_the_push_before_it_starts(
        cluster: Sandbox, image: str) -> None:
    assert gpucluster("provision", "-i", str(cluster.inventory), "--only", "ssh-mesh",
                      timeout=300).code == 0
    for node in cluster.nodes:  # every node needs the image: a chain of three hops
        cluster.node_exec(node, f"podman rmi -f {image} >/dev/null 2>&1; true")
    # node3 refuses node2's SSH: the chain's second link cannot come up.
    rule = (f"INPUT -s {cluster.addresses['node2']} -p tcp --dport 22 -j REJECT "
            f"--reject-with tcp-reset")
    cluster.node_exec("node3", f"iptables -I {rule}")
    try:
        inventory = cluster.write_inventory(cluster.inventory.parent / "image.yaml",
                                            cluster={**cluster.data["cluster"], "image": image})
        result = gpucluster("provision", "-i", str(inventory), "--json", "--only", "image",
                            timeout=300)
    finally:
        cluster.node_exec("node3", f"iptables -D {rule}")
    results = {r["host"]: r for r in json.loads(result.stdout)["results"]}
    assert result.code == 1
    for node in cluster.nodes:
        assert results[node]["outcome"] == "failed", results[node]
        assert "nothing was sent" in results[node]["message"]
        assert "node2 could not link to node3" in results[node]["message"]
        assert "Connection refused" in results[node]["message"]  # what ssh said
        found = cluster.node_exec(node, f"podman image exists {image}", check=False)
        assert found.returncode != 0, f"{node} loaded the image: the stream was not held"
        work_dir = cluster.data["cluster"].get("work_dir", "~/gpucluster")
        leftovers = cluster.node_exec(node, f"ls -d {work_dir}/.relay-* 2>/dev/null || true")
        assert leftovers.stdout.strip() == "", f"{node}: {leftovers.stdout}"
    # No hop's process is left (masters, links, fifo readers): nodes share the pid space.
    # (The brackets keep pgrep's own command line from matching.)
    left = subprocess.run(["pgrep", "-af", "[.]relay-[0-9a-f]{8}-"], capture_output=True,
                          text=True, check=False)
    assert left.stdout == "", left.stdout
    # With the link back, the same push goes through: the failure left nothing in the way.
    again = gpucluster("provision", "-i", str(inventory), "--json", "--only", "image",
                       timeout=300)
    assert again.code == 0, again.stdout
    assert set(_outcomes(json.loads(again.stdout)).values()) == {"changed"}


def test_image_too_big_for_a_node_is_refused_before_sending(cluster: Sandbox, image: str
                                                           ) -> None:
    # node3's container storage is a 4 MiB tmpfs: too small for the 8 MB image.
    cluster.node_exec("node3", "podman rmi -f --all >/dev/null 2>&1; "
                               "mount -t tmpfs -o size=4m tmpfs /var/lib/containers")
    try:
        inventory = cluster.write_inventory(cluster.inventory.parent / "image.yaml",
                                            cluster={**cluster.data["cluster"], "image": image})
        result = gpucluster("provision", "-i", str(inventory), "--json", "--only", "image",
                            timeout=300)
        results = {r["host"]: r for r in json.loads(result.stdout)["results"]}
        assert result.code == 1
        assert results["node3"]["outcome"] == "failed"
        assert "not enough disk" in results["node3"]["message"]
        assert "GiB free" in results["node3"]["message"]
        assert results["node1"]["outcome"] == "already ok"
    finally:
        cluster.node_exec("node3", "umount -R /var/lib/containers")  # podman mounts inside


def test_image_push_shows_bytes_per_node_on_a_terminal(cluster: Sandbox, image: str
                                                      ) -> None:
    cluster.node_exec("node2", f"podman rmi -f {image} >/dev/null")
    inventory = cluster.write_inventory(cluster.inventory.parent / "image.yaml",
                                        cluster={**cluster.data["cluster"], "image": image})
    command = shlex.join([sys.executable, "-m", "gpucluster", "provision", "-i",
                          str(inventory), "--only", "image"])
    # `script` gives the CLI a terminal, as a user's shell would: the bars only show there
    shown = subprocess.run(["script", "-qefc", command, "/dev/null"], capture_output=True,
                           text=True, timeout=300, check=False,
                           env={**os.environ, "COLUMNS": "120", "TERM": "xterm"})
    assert shown.returncode == 0, shown.stdout
    plain = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", shown.stdout)  # no colours or cursor moves
    bars = [line for line in re.split(r"[\r\n]", plain) if "node2" in line and "MB" in line]
    assert bars, shown.stdout
    final = re.search(r"node2\s.*?(\d+\.\d+)/(\d+\.\d+) MB\s+(\d+\.\d+) MB/s", bars[-1])
    assert final, bars[-1]
    assert final.group(1) == final.group(2) and float(final.group(1)) > 8.0  # all 8+ MB
    assert not any("node1" in line and "MB/s" in line for line in re.split(r"[\r\n]", plain))


def test_smoke_through_the_provisioned_cluster(cluster: Sandbox) -> None:
    result = gpucluster("smoke", "-i", str(cluster.inventory), "--json",
                        "--nproc-per-node", "2", timeout=300)
    payload = json.loads(result.stdout)
    assert result.code == 0, payload
    assert payload["passed"] and payload["backend"] == "gloo" and payload["world_size"] == 6
    assert [e["bytes"] for e in payload["sweep"]] == [1 << 16, 1 << 18, 1 << 20, 1 << 22]
    assert all(e["correct"] and e["busbw_gbps"] > 0 for e in payload["sweep"])
    for entry in payload["sweep"]:  # busbw = algbw * 2(n-1)/n, as nccl-tests define it
        assert abs(entry["busbw_gbps"] - entry["algbw_gbps"] * 2 * 5 / 6) < 1e-9
    assert set(payload["per_node"]) == set(cluster.nodes)
    human = gpucluster("smoke", "-i", str(cluster.inventory), timeout=300)
    assert "backend gloo" in human.stdout and "smoke: passed" in human.stdout


def test_smoke_with_a_node_that_does_not_answer_is_not_run_and_says_why(cluster: Sandbox
                                                                         ) -> None:
    cluster.node_exec("node3", "iptables -I INPUT -p tcp --dport 22 -j DROP")
    try:
        human = gpucluster("smoke", "-i", str(cluster.inventory), "--connect-timeout", "2",
                           timeout=300)
    finally:
        cluster.node_exec("node3", "iptables -D INPUT -p tcp --dport 22 -j DROP")
    assert human.code == 1, human.stdout + human.stderr
    # Not started on the others (whose torchrun would wait a minute for node3), and
    # the reason shown, not only referred to
    assert human.stdout.splitlines()[:3] == [
        "FAIL not run: node3 could not take part",
        f"FAIL node3: unreachable: no answer from {cluster.addresses['node3']}:22 within 2s",
        "smoke: FAILED"]


def test_smoke_names_the_node_with_a_slow_link(cluster: Sandbox) -> None:
    cluster.restage("--link-rate", "node3=20mbit")
    try:
        result = gpucluster("smoke", "-i", str(cluster.inventory), "--json",
                            "--sizes", "65536", timeout=300)
        payload = json.loads(result.stdout)
        assert list(payload["slow"]) == ["node3"], payload["per_node"]
        assert payload["slow"]["node3"].startswith("link to the head")
    finally:
        cluster.restage()


def test_smoke_across_jumbo_frames_the_network_drops_fails_pointing_at_path_mtu(
        cluster: Sandbox) -> None:
    """node2 and node3 at MTU 9000, the sandbox's switch at 1500: the all-reduce's
    full-size packets between them are lost. Seen either way on the sandbox: gloo gives
    up on the connection after about 30 s (its rank's error, and the cause it names), or
    the run outlasts --timeout; both name the check that finds it."""
    cluster.restage("--mtu", "node2=9000", "--mtu", "node3=9000")
    try:
        human = gpucluster("smoke", "-i", str(cluster.inventory), "--timeout", "40",
                           timeout=300)
    finally:
        cluster.restage()
    out = " ".join(human.stdout.split())
    assert human.code == 1 and "smoke: FAILED" in out, out
    assert "error_file" not in out  # torchrun's footer is not a node's error
    assert "Connection timed out" in out or "no result within --timeout 40s" in out, out
    assert "path-mtu" in out, out


def test_ufw_rules_are_added_once_and_undone_exactly(cluster: Sandbox) -> None:
    # node3 swaps its plain iptables firewall for ufw (SSH allowed), as many hosts have.
    cluster.node_exec("node3", "iptables -P INPUT ACCEPT; iptables -F INPUT; "
                               "ufw allow 22/tcp >/dev/null; ufw --force enable >/dev/null")
    try:
        before = cluster.node_exec("node3", "ufw status").stdout
        code, payload = _provision(cluster, "--only", "firewall")
        assert code == 0, payload
        assert _outcomes(payload)[("firewall", "node3")] == "changed"
        status = cluster.node_exec("node3", "ufw status").stdout
        for peer in ("node1", "node2"):
            assert any(cluster.addresses[peer] in line and "# gpucluster" in line
                       and "29500" in line for line in status.splitlines())
        code, again = _provision(cluster, "--only", "firewall")
        assert _outcomes(again)[("firewall", "node3")] == "already ok"
        done = gpucluster("provision", "-i", str(cluster.inventory), "--undo", "firewall")
        assert done.code == 0, done.stderr
        assert cluster.node_exec("node3", "ufw status").stdout == before
    finally:
        cluster.node_exec("node3", f"ufw --force disable >/dev/null; ufw --force reset "
                                   f">/dev/null; iptables -F INPUT; {FIREWALL}")


def _reaches(cluster: Sandbox, source: str, target: str, port: int) -> bool:
    """Whether `source` can open a TCP connection to a fresh listener on `target`."""
    cluster.node_exec(target, f"setsid timeout 15 python3 -c 'import socket; s = "
                              f"socket.socket(); s.setsockopt(1, 2, 1); s.bind((\"\", {port})); "
                              f"s.listen(); s.accept()' >/dev/null 2>&1 < /dev/null &")
    time.sleep(0.5)
    dial = cluster.node_exec(source, f"python3 -c 'import socket; socket.create_connection("
                                     f"(\"{cluster.addresses[target]}\", {port}), timeout=3)'",
                             check=False)
    _kill_in_node(cluster, target, b"s.listen()")
    return dial.returncode == 0


def _kill_in_node(cluster: Sandbox, node: str, marker: bytes) -> None:
    """Kill the node's processes whose command line holds `marker` (by its namespace:
    a pattern given to pkill would also match processes of the host and other nodes)."""
    pids = subprocess.run(["ip", "netns", "pids", f"{cluster.name}-{node}"],
                          capture_output=True, text=True, check=True).stdout.split()
    for pid in pids:
        try:
            if marker in Path(f"/proc/{pid}/cmdline").read_bytes():
                os.kill(int(pid), 15)
        except (OSError, ValueError):
            pass  # gone meanwhile


def test_firewalld_rules_open_the_port_to_peers_and_are_undone(cluster: Sandbox) -> None:
    # node3 swaps its iptables firewall for firewalld (its own system D-Bus, its own
    # /run), as RHEL-family hosts have: the public zone admits SSH only.
    mount_point = Path("/run/firewalld")  # /run is shared: the node's tmpfs mounts on it
    made_mount_point = not mount_point.exists()
    cluster.node_exec("node3", "iptables -P INPUT ACCEPT; iptables -F INPUT; "
                               "mkdir -p /run/firewalld; mount -t tmpfs tmpfs /run/dbus; "
                               "mount -t tmpfs tmpfs /run/firewalld; "
                               "dbus-daemon --system --fork --nopidfile; "
                               "setsid firewalld --nofork --nopid >/dev/null 2>&1 < /dev/null &")
    try:
        for _ in range(60):
            state = cluster.node_exec("node3", "firewall-cmd --state", check=False)
            if state.stdout.strip() == "running":
                break
            time.sleep(0.5)
        assert state.stdout.strip() == "running", state.stdout + state.stderr
        before = cluster.node_exec("node3", "firewall-cmd --list-all").stdout
        assert not _reaches(cluster, "node1", "node3", 29500)  # the zone rejects it

        code, payload = _provision(cluster, "--only", "firewall")
        assert code == 0, payload
        assert _outcomes(payload)[("firewall", "node3")] == "changed"
        rules = cluster.node_exec("node3", "firewall-cmd --list-rich-rules").stdout
        for peer in ("node1", "node2"):
            assert f'source address="{cluster.addresses[peer]}" port port="29500"' in rules
        assert cluster.addresses["node3"] not in rules  # peers only, not itself
        assert _reaches(cluster, "node1", "node3", 29500)
        code, again = _provision(cluster, "--only", "firewall")
        assert _outcomes(again)[("firewall", "node3")] == "already ok"

        done = gpucluster("provision", "-i", str(cluster.inventory), "--undo", "firewall")
        assert done.code == 0, done.stderr
        assert cluster.node_exec("node3", "firewall-cmd --list-all").stdout == before
        assert not _reaches(cluster, "node1", "node3", 29500)
    finally:
        _kill_in_node(cluster, "node3", b"firewalld")
        _kill_in_node(cluster, "node3", b"dbus-daemon")
        time.sleep(1)
        cluster.node_exec("node3", "nft delete table inet firewalld 2>/dev/null; umount "
                                   f"/run/dbus /run/firewalld; iptables -F INPUT; {FIREWALL}",
                          check=False)
        if made_mount_point:
            mount_point.rmdir()


def test_docker_forward_drop_is_no_firewall_and_native_nftables_is_opened(sandbox: Sandbox) -> None:
    """A FORWARD drop policy (as Docker sets) is no input firewall: nothing to open. A
    native nftables input chain that drops gets our rules at its top, and loses them on
    undo."""
    node = "node2"
    sandbox.node_exec(node, "iptables -P FORWARD DROP; iptables -N DOCKER; "
                            "iptables -A FORWARD -j DOCKER")
    try:
        code, payload = _provision(sandbox, "--only", "firewall")
        assert code == 0
        assert _outcomes(payload)[("firewall", node)] == "already ok"
    finally:
        sandbox.node_exec(node, "iptables -P FORWARD ACCEPT; iptables -F FORWARD; "
                                "iptables -X DOCKER")
    sandbox.node_exec(node, "nft add table inet fw && nft add chain inet fw input "
                            "'{ type filter hook input priority 0; policy drop; }' && "
                            "nft add rule inet fw input ct state established,related accept "
                            "&& nft add rule inet fw input tcp dport 22 accept")
    try:
        before = sandbox.node_exec(node, "nft list ruleset").stdout
        assert not _reaches(sandbox, "node1", node, 29500)
        code, payload = _provision(sandbox, "--only", "firewall")
        assert code == 0, payload
        assert _outcomes(payload)[("firewall", node)] == "changed"
        assert _outcomes(payload)[("firewall", "node1")] == "already ok"
        chain = sandbox.node_exec(node, "nft list chain inet fw input").stdout
        for peer in ("node1", "node3", "node4"):
            assert (f"ip saddr {sandbox.addresses[peer]} tcp dport {{ 29500, 32768-60999 }} "
                    f'accept comment "gpucluster"') in chain
        assert chain.index("gpucluster") < chain.index("tcp dport 22")  # before the drop
        assert _reaches(sandbox, "node1", node, 29500)
        code, again = _provision(sandbox, "--only", "firewall")
        assert _outcomes(again)[("firewall", node)] == "already ok"
        done = gpucluster("provision", "-i", str(sandbox.inventory), "--undo", "firewall")
        assert done.code == 0, done.stderr
        assert sandbox.node_exec(node, "nft list ruleset").stdout == before
    finally:
        sandbox.node_exec(node, "nft delete table inet fw")


def test_ipv6_peers_are_opened_by_ip6tables_and_nft_exactly_once_and_undone(
        cluster: Sandbox, tmp_path: Path) -> None:
    """The rules planned for IPv6 (and mixed) peers, run by the real tools in a node and
    read back by the step's own detection: the next plan is empty (the text matches
    what ip6tables and nft print), and undo removes exactly them."""
    from gpucluster import inventory as inventory_module
    from gpucluster.provision.logged import CommandLog, LoggedConnection
    from gpucluster.provision.steps_firewall import detect, plan_commands
    from gpucluster.remote.session import Session
    from gpucluster.remote.ssh import SshOptions

    peers = ["fd00:9::12", "fd00:9::13", "198.19.2.12"]
    loaded = inventory_module.load(cluster.inventory)
    node = "node1"
    saved = cluster.node_exec(node, "iptables-save; echo ---; ip6tables-save; echo ---; "
                                    "nft list ruleset").stdout
    try:
        with Session(loaded, SshOptions(known_hosts=Path(loaded.cluster.known_hosts))) as s:
            shell = LoggedConnection(s.connection(loaded.host(node)),
                                     CommandLog(tmp_path / "log"))

            def converge(wanted: list[str]) -> list[str]:
                commands = plan_commands(detect(shell), wanted, 29500)
                for command in commands:
                    done = shell.run(command, timeout=30, sudo=True)
                    assert done.ok, (command, done.stderr)
                return commands

            # iptables (the fixture's IPv4 default drop) with an IPv6 default drop beside it
            cluster.node_exec(node, "ip6tables -P INPUT DROP")
            added = converge(peers)
            assert sorted(c.split()[0] for c in added) == ["ip6tables", "ip6tables",
                                                           "iptables"]
            v6 = cluster.node_exec(node, "ip6tables -S INPUT").stdout
            assert "-A INPUT -s fd00:9::12/128 -p tcp -m multiport --dports 29500," in v6
            assert converge(peers) == []  # read back as planned: nothing to do
            assert len(converge([])) == 3  # undo
            assert "gpucluster" not in cluster.node_exec(node, "ip6tables -S INPUT").stdout

            # nftables: the node's own inet chain that drops, IPv4 and IPv6 peers in it
            cluster.node_exec(node, "ip6tables -P INPUT ACCEPT; iptables -P INPUT ACCEPT; "
                                    "iptables -F INPUT; nft add table inet site; nft 'add "
                                    "chain inet site input { type filter hook input priority"
                                    " 0; policy drop; }'; nft add rule inet site input tcp "
                                    "dport 22 accept; nft add rule inet site input ct state "
                                    "established,related accept")
            added = converge(peers)
            assert len(added) == 3 and sum("ip6 saddr" in c for c in added) == 2
            assert converge(peers) == []
            assert len(converge([])) == 3
            assert "gpucluster" not in cluster.node_exec(node, "nft list ruleset").stdout
    finally:
        v4, v6, _ = saved.split("---\n")
        cluster.node_exec(node, "nft delete table inet site 2>/dev/null; "
                                f"iptables-restore <<'EOF'\n{v4}EOF\n"
                                f"ip6tables-restore <<'EOF'\n{v6}EOF\n")
