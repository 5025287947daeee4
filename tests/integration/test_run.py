"""`gpucluster run` against real sshd nodes."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.cli import gpucluster
from tests.sandbox import Sandbox

pytestmark = pytest.mark.sandbox


def test_every_node_answers_with_its_own_hostname(sandbox: Sandbox) -> None:
    result = gpucluster("run", "-i", str(sandbox.inventory), "--json", "hostname; nproc")
    assert result.code == 0, result.stderr
    payload = result.json()
    assert payload["schema"] == 1
    by_host = {h["host"]: h for h in payload["hosts"]}
    assert sorted(by_host) == sandbox.nodes
    for node, host in by_host.items():
        assert host["ok"] and host["exit_code"] == 0 and host["error"] is None
        assert host["stdout"].splitlines()[0] == node


def test_identical_outputs_are_folded_and_unique_ones_prefixed(sandbox: Sandbox) -> None:
    same = gpucluster("run", "-i", str(sandbox.inventory), "echo same")
    assert same.code == 0
    assert "node[1-4] (4)" in same.stdout
    assert same.stdout.count("same") == 1
    different = gpucluster("run", "-i", str(sandbox.inventory), "hostname")
    for node in sandbox.nodes:
        assert f"{node}: {node}" in different.stdout


def test_a_command_reading_stdin_sees_its_end_at_once(sandbox: Sandbox) -> None:
    """As `ssh -n`: nothing is sent, so `cat` ends instead of waiting out the limit."""
    done = gpucluster("run", "-i", str(sandbox.inventory), "-t", "15", "cat; echo read-all")
    assert done.code == 0, done.stderr
    assert "read-all" in done.stdout


def test_selection_by_range_and_by_group(sandbox: Sandbox, tmp_path: Path) -> None:
    picked = gpucluster("run", "-i", str(sandbox.inventory), "--json", "--hosts",
                        "node[2-3]", "hostname")
    assert [h["host"] for h in picked.json()["hosts"]] == ["node2", "node3"]
    inventory = sandbox.write_inventory(tmp_path / "groups.yaml",
                                        groups={"evens": ["node2", "node4"]})
    grouped = gpucluster("run", "-i", str(inventory), "--json", "--group", "evens", "hostname")
    assert grouped.code == 0, grouped.stderr
    assert [h["stdout"].strip() for h in grouped.json()["hosts"]] == ["node2", "node4"]
    unknown = gpucluster("run", "-i", str(inventory), "--hosts", "node9", "true")
    assert unknown.code == 2 and "node9" in unknown.stderr


def test_failing_hosts_are_summarised_and_set_the_exit_code(sandbox: Sandbox) -> None:
    result = gpucluster("run", "-i", str(sandbox.inventory),
                        'case "$(hostname)" in node2) exit 7;; esac; echo fine')
    assert result.code == 1
    assert "1 of 4 hosts failed: node2 (exit 7)" in result.stderr
    assert "node[1,3-4] (3)" in result.stdout


def test_unreachable_host_is_reported_while_the_others_answer(sandbox: Sandbox,
                                                              tmp_path: Path) -> None:
    hosts = [*sandbox.data["hosts"], {"name": "ghost", "address": "198.19.0.200"}]
    cluster = {**sandbox.data["cluster"], "connect_timeout": 2}
    inventory = sandbox.write_inventory(tmp_path / "ghost.yaml", hosts=hosts, cluster=cluster)
    result = gpucluster("run", "-i", str(inventory), "--json", "hostname")
    assert result.code == 1
    by_host = {h["host"]: h for h in result.json()["hosts"]}
    assert by_host["ghost"]["error"]["kind"] == "unreachable"
    assert all(by_host[n]["ok"] for n in sandbox.nodes)


def test_a_stopped_sshd_is_unreachable_and_up_repairs_it(sandbox: Sandbox) -> None:
    victim = "node3"
    sandbox.node_exec(victim, f"kill {sandbox.sshd_pid(victim)}")
    try:
        result = gpucluster("run", "-i", str(sandbox.inventory), "--json", "hostname")
        by_host = {h["host"]: h for h in result.json()["hosts"]}
        assert result.code == 1
        assert by_host[victim]["error"]["kind"] == "unreachable"
        assert "cannot connect" in by_host[victim]["error"]["message"]
        assert [n for n in sandbox.nodes if by_host[n]["ok"]] == ["node1", "node2", "node4"]
    finally:
        repair = gpucluster("sandbox", "up", "--name", sandbox.name, "--subnet",
                            "198.19.0.0/24", "--nodes", "4", "--write-inventory",
                            str(sandbox.inventory))
    assert repair.code == 0, repair.stderr
    assert "started: node3" in repair.stdout
    assert gpucluster("run", "-i", str(sandbox.inventory), "true").code == 0


def _processes_running(pattern: str) -> list[str]:
    """Command lines of live processes matching `pattern` anywhere on this machine (the
    nodes share its process table)."""
    done = subprocess.run(["pgrep", "-a", "-f", pattern], capture_output=True, text=True,
                          check=False)
    return [line for line in done.stdout.splitlines() if "pgrep" not in line]


def test_a_command_a_signal_ended_is_named_with_its_signal(sandbox: Sandbox) -> None:
    """sshd sends exit-signal for it, which paramiko drops: it read `ended by a signal`
    where the OOM killer's SIGKILL was the whole story."""
    result = gpucluster("run", "-i", str(sandbox.inventory), "-w", "node1",
                        "kill -KILL $$")
    assert result.code == 1
    assert "node1: killed by SIGKILL (no exit code)" in result.stdout, result.stdout
    assert "1 of 1 host failed: node1 (killed by SIGKILL)" in result.stderr, result.stderr
    ended = gpucluster("run", "-i", str(sandbox.inventory), "-w", "node2", "--json",
                       "kill -TERM $$")
    assert {k: ended.json()["hosts"][0][k] for k in ("exit_code", "signal")} == \
        {"exit_code": -1, "signal": "TERM"}
    normal = gpucluster("run", "-i", str(sandbox.inventory), "--json", "exit 3")
    assert {(h["exit_code"], h["signal"]) for h in normal.json()["hosts"]} == {(3, None)}


def test_command_timeout_is_a_typed_failure_and_leaves_nothing_running(
        sandbox: Sandbox) -> None:
    result = gpucluster("run", "-i", str(sandbox.inventory), "--json", "--timeout", "1",
                        "echo on $(hostname); sleep 4241 & sleep 4242; wait")
    assert result.code == 1
    assert {h["error"]["kind"] for h in result.json()["hosts"]} == {"timed out"}
    # with what each had printed before its time ran out
    assert [h["error"]["output"] for h in result.json()["hosts"]] == [
        f"on {h['host']}\n" for h in result.json()["hosts"]]
    deadline = time.monotonic() + 5
    while _processes_running("sleep 424[12]") and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _processes_running("sleep 424[12]") == []  # on no node, children included


@pytest.mark.parametrize("login", ["", "trap \"\" PIPE; "], ids=["plain", "ignoring-sigpipe"])
def test_a_command_whose_login_outlasts_its_timeout_never_starts(sandbox: Sandbox,
                                                                 login: str) -> None:
    """The time limit ends while node2's login script still runs: nothing is left to end
    yet (the shell has not said its pid), and the command must not start afterwards with
    nobody watching it. Its shell dies writing its pid to the closed channel, or, where a
    login script ignores SIGPIPE, exits when that write fails."""
    marker = "/tmp/gpc-late-start-4244"
    sandbox.node_exec("node2", f"rm -f {marker}")
    with sandbox.slow_login("node2", 3, login):
        result = gpucluster("run", "-i", str(sandbox.inventory), "-w", "node2", "--json",
                            "--timeout", "1", f"touch {marker}; sleep 4244")
        assert result.code == 1
        assert result.json()["hosts"][0]["error"]["kind"] == "timed out"
        deadline = time.monotonic() + 10  # the login's 3 s, then its shell ends either way
        while _processes_running(marker) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert _processes_running(marker) == []
    assert sandbox.node_exec("node2", f"ls {marker}", check=False).returncode != 0
    assert _processes_running("sleep 4244") == []


def test_env_values_never_appear_in_a_nodes_process_list(sandbox: Sandbox,
                                                         tmp_path: Path) -> None:
    secret = "hf_gpcSecretValue4243"
    cluster = {**sandbox.data["cluster"], "env": {"HF_TOKEN": secret}}
    inventory = sandbox.write_inventory(tmp_path / "secret.yaml", cluster=cluster)
    process = subprocess.Popen([sys.executable, "-m", "gpucluster", "run", "-i",
                                str(inventory), "--sudo", 'sleep 3; printf %s "$HF_TOKEN"'],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    time.sleep(1.5)
    seen = subprocess.run(["sh", "-c", "cat /proc/[0-9]*/cmdline 2>/dev/null | tr '\\0' ' '"],
                          capture_output=True, text=True, check=False).stdout
    out, err = process.communicate(timeout=60)
    assert process.returncode == 0, err
    assert secret in out  # the command had it
    assert "sleep 3" in seen and secret not in seen  # but no command line showed it


def test_inventory_values_are_quoted_never_executed(sandbox: Sandbox, tmp_path: Path) -> None:
    hostile = "x; touch /tmp/pwned; $(touch /tmp/pwned2) `touch /tmp/pwned3`"
    cluster = {**sandbox.data["cluster"], "env": {"PROBE": hostile}}
    inventory = sandbox.write_inventory(tmp_path / "hostile.yaml", cluster=cluster)
    result = gpucluster("run", "-i", str(inventory), "--json", "--hosts", "node1",
                        'printf %s "$PROBE"')
    assert result.code == 0, result.stderr
    assert result.json()["hosts"][0]["stdout"] == hostile
    leftovers = sandbox.node_exec("node1", "ls /tmp/pwned /tmp/pwned2 /tmp/pwned3", check=False)
    assert leftovers.returncode != 0, "a quoted inventory value was executed"


def test_jump_host_reaches_a_node_the_controller_cannot(sandbox: Sandbox,
                                                       tmp_path: Path) -> None:
    # node4 drops SSH from the controller (the bridge address); node1 may still reach it.
    rule = "INPUT -p tcp --dport 22 -s 198.19.0.1 -j DROP"
    sandbox.node_exec("node4", f"iptables -A {rule}")
    try:
        cluster = {**sandbox.data["cluster"], "connect_timeout": 2}
        direct = sandbox.write_inventory(tmp_path / "direct.yaml", cluster=cluster)
        blocked = gpucluster("run", "-i", str(direct), "--json", "--hosts", "node4", "hostname")
        assert blocked.json()["hosts"][0]["error"]["kind"] == "unreachable"
        hosts = [dict(h) for h in sandbox.data["hosts"]]
        hosts[3]["jump_host"] = "node1"
        via = sandbox.write_inventory(tmp_path / "jump.yaml", hosts=hosts, cluster=cluster)
        jumped = gpucluster("run", "-i", str(via), "--json", "--hosts", "node4", "hostname")
        assert jumped.code == 0, jumped.stdout + jumped.stderr
        assert jumped.json()["hosts"][0]["stdout"].strip() == "node4"
    finally:
        sandbox.node_exec("node4", f"iptables -D {rule}")


def test_ssh_config_proxycommand_and_a_second_identity_file(sandbox: Sandbox,
                                                             tmp_path: Path) -> None:
    # node4 drops SSH from the controller; the ssh config's ProxyCommand (OpenSSH's own
    # -W through node1) reaches it, and the key that works is the config's second one.
    rule = "INPUT -p tcp --dport 22 -s 198.19.0.1 -j DROP"
    key = sandbox.data["defaults"]["identity_file"]
    known_hosts = sandbox.data["cluster"]["known_hosts"]
    wrong = tmp_path / "wrong_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(wrong)],
                   check=True)
    config = tmp_path / "ssh_config"
    config.write_text(
        f"Host proxied\n  HostName {sandbox.addresses['node4']}\n  User root\n"
        f"  IdentityFile {wrong}\n  IdentityFile {key}\n  ConnectTimeout 5\n"
        f"  ProxyCommand ssh -o BatchMode=yes -o StrictHostKeyChecking=yes "
        f"-o UserKnownHostsFile={known_hosts} -i {key} -W %h:%p "
        f"root@{sandbox.addresses['node1']}\n")
    cluster = {**sandbox.data["cluster"], "ssh_config": str(config)}
    inventory = sandbox.write_inventory(tmp_path / "proxied.yaml", cluster=cluster,
                                        defaults={}, hosts=["proxied"])
    sandbox.node_exec("node4", f"iptables -A {rule}")
    try:
        result = gpucluster("run", "-i", str(inventory), "--json", "hostname")
        assert result.code == 0, result.stdout + result.stderr
        assert result.json()["hosts"][0]["stdout"].strip() == "node4"
    finally:
        sandbox.node_exec("node4", f"iptables -D {rule}")


def test_ssh_config_alias_resolves(sandbox: Sandbox, tmp_path: Path) -> None:
    config = tmp_path / "ssh_config"
    config.write_text(
        f"Host trainbox\n  HostName {sandbox.addresses['node2']}\n  User root\n"
        f"  IdentityFile {sandbox.data['defaults']['identity_file']}\n")
    inventory = sandbox.write_inventory(
        tmp_path / "alias.yaml", hosts=[{"name": "trainbox"}],
        defaults={"labels": {"via": "ssh-config"}},
        cluster={**sandbox.data["cluster"], "ssh_config": str(config)})
    result = gpucluster("run", "-i", str(inventory), "--json", "hostname")
    assert result.code == 0, result.stdout + result.stderr
    assert result.json()["hosts"][0]["stdout"].strip() == "node2"


def test_ctrl_c_ends_the_fanout_promptly_and_what_it_started(sandbox: Sandbox) -> None:
    process = subprocess.Popen(
        [sys.executable, "-m", "gpucluster", "run", "-i", str(sandbox.inventory),
         "sleep 4244"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 20
    # As soon as every node's shell has started (a Ctrl-C that early is the hard case).
    while len(_processes_running("sleep 4244")) < len(sandbox.nodes):
        assert time.monotonic() < deadline, "the sleeps never started"
        time.sleep(0.2)
    process.send_signal(signal.SIGINT)
    time.sleep(0.02)
    process.send_signal(signal.SIGINT)  # pressed twice: the clean-up still runs whole
    _, stderr = process.communicate(timeout=20)
    assert process.returncode == 130
    nodes = len(sandbox.nodes)
    assert f"interrupted; {nodes} of {nodes} hosts had not finished" in stderr, stderr
    assert "Traceback" not in stderr
    assert _processes_running("sleep 4244") == []  # ended on every node before exiting
