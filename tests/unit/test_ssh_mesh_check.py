"""Doctor's ssh-mesh check: each node's login to the next, judged from the probe's
section, and the probe's own script run here with an `ssh` stand-in."""

from __future__ import annotations

import dataclasses
import io
import time
from pathlib import Path

from gpucluster import inventory as inventory_module
from gpucluster.doctor import probe
from gpucluster.doctor.checks.ssh_mesh import ring_peer
from gpucluster.doctor.model import REGISTRY, CheckResult, Context, Status
from gpucluster.remote.local import LocalConnection
from gpucluster.remote.result import FailureKind, HostFailure
from tests.stand_ins import stand_in

REFUSED = "root@{peer}: Permission denied (publickey)."


def facts(peer: str, code: int, said: str = "") -> probe.NodeFacts:
    """A node's probe output with its ssh-mesh section (peer, ssh's words, exit code)."""
    output = f"@@gpc section ssh_mesh\npeer {peer}\n{said}\n@@gpc end {code}\n"
    return probe.parse_facts(output, time.time())


def cluster(tmp_path: Path, *names: str) -> inventory_module.Inventory:
    path = tmp_path / "inventory.yaml"
    path.write_text(f"hosts: [{', '.join(names)}]\n")
    return inventory_module.load(path)


def judged(tmp_path: Path, node_facts: dict[str, probe.NodeFacts],
           unreachable: tuple[str, ...] = ()) -> dict[str, CheckResult]:
    names = (*node_facts, *unreachable)
    down = {n: HostFailure(n, FailureKind.UNREACHABLE, "no route") for n in unreachable}
    context = Context(cluster(tmp_path, *names), node_facts, down, {})
    return {r.host: r for r in REGISTRY["ssh-mesh"].run(context)}


def test_each_node_logs_in_to_the_next_and_the_last_to_the_first(tmp_path: Path) -> None:
    inventory = cluster(tmp_path, "a", "b", "c")
    assert [ring_peer(inventory, n) for n in "abc"] == ["b", "c", "a"]
    assert ring_peer(cluster(tmp_path, "a"), "a") is None  # no pair to try


def test_a_node_that_cannot_log_in_to_the_next_is_named_with_ssh_s_words(
        tmp_path: Path) -> None:
    results = judged(tmp_path, {"a": facts("b", 0), "b": facts("c", 255, REFUSED.format(
        peer="c")), "c": facts("a", 0)})
    assert {n: r.status for n, r in results.items()} == {
        "a": Status.OK, "b": Status.WARN, "c": Status.OK}
    assert results["b"].message.startswith(
        "cannot log in to c over SSH (root@c: Permission denied (publickey).): a node where "
        "a detached job (launch -d) fails cannot stop it on the others")
    assert "gpucluster provision --only ssh-mesh" in results["b"].remedy
    assert results["a"].message == "logs in to b with keys, host key verified"


def test_a_cluster_without_the_mesh_gets_one_finding_for_every_node(tmp_path: Path) -> None:
    said = "ssh: Could not resolve hostname {peer}: Name or service not known"
    results = judged(tmp_path, {n: facts(p, 255, said.format(peer=p))
                                for n, p in (("a", "b"), ("b", "c"), ("c", "a"))})
    assert {r.status for r in results.values()} == {Status.WARN}
    # Identical findings fold into one (node[1-16]: ...), naming one pair as an example.
    assert len({(r.message, r.remedy) for r in results.values()}) == 1
    assert results["c"].message.startswith(
        "no node logs in to the next over SSH (a to b: ssh: Could not resolve hostname b:")
    assert results["c"].details["peer"] == "a"


def test_a_login_that_hangs_or_has_no_client_says_so(tmp_path: Path) -> None:
    results = judged(tmp_path, {"a": facts("b", 124), "b": facts("c", 127, "sh: ssh: not "
                                                                            "found"),
                                "c": facts("a", 0)})
    assert "(no login within 10 s)" in results["a"].message
    assert "(no ssh client on this node)" in results["b"].message


def test_a_login_to_a_node_doctor_could_not_reach_is_not_judged(tmp_path: Path) -> None:
    results = judged(tmp_path, {"a": facts("b", 255, "ssh: connect to host b port 22: "
                                                     "Connection timed out"),
                                "c": facts("a", 0)}, unreachable=("b",))
    assert results["a"].status is Status.SKIP
    assert "b, the node it logs in to, did not answer doctor" in results["a"].message
    assert results["c"].status is Status.OK


def test_a_single_node_or_a_probe_without_the_section_is_skipped(tmp_path: Path) -> None:
    assert judged(tmp_path, {"a": facts("a", 0)})["a"].status is Status.SKIP
    bare = dataclasses.replace(facts("b", 0), sections={})
    result = judged(tmp_path, {"a": bare, "b": facts("a", 0)})["a"]
    assert (result.status, result.message) == (Status.SKIP, "not tested: the probe did not "
                                                            "try it")


def test_the_probe_logs_in_with_keys_only_and_the_host_key_verified(tmp_path: Path) -> None:
    """The real probe script, with an `ssh` on its PATH that records how it was called
    and refuses as a node without the peer's host key does."""
    bin_dir = tmp_path / "bin"
    called = tmp_path / "called"
    stand_in(bin_dir, "ssh", f'printf "%s\\n" "$@" > {called}\n'
                             f'echo "Host key verification failed." >&2\nexit 255\n')
    script = probe.render_probe(cluster(tmp_path, "a", "b"), frozenset({"ssh_mesh"}))
    result = LocalConnection("a").run(
        f"export PATH={bin_dir}:$PATH GPC_SSH_PEER=b; {script}", timeout=60,
        stdin=io.BytesIO(b"secret\n"))
    login = probe.parse_facts(result.stdout, time.time()).sections["ssh_mesh"]
    assert login.exit_code == 255
    assert login.output.split("\n")[:2] == ["peer b", "Host key verification failed."]
    words = called.read_text().split()
    assert words[0] == "-n"  # never the probe's stdin (a typed sudo password)
    assert "BatchMode=yes" in words and "StrictHostKeyChecking=yes" in words
    assert words[-2:] == ["b", "true"]
    # Without a peer named (one node), no login is tried and no section printed.
    alone = LocalConnection("a").run(f"export PATH={bin_dir}:$PATH; {script}", timeout=60)
    assert "ssh_mesh" not in probe.parse_facts(alone.stdout, time.time()).sections
