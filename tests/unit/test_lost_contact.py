"""A node lost while the job runs: the node gone, or this machine cut off from every
node. The nodes here answer for real (local connections) or refuse (an SSH port nobody
listens on)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from gpucluster import inventory as inventory_module
from gpucluster.launch import lost_contact
from gpucluster.launch.lost_contact import LostContact, Verdict
from gpucluster.launch.model import NodeState
from gpucluster.remote.session import Session
from gpucluster.remote.ssh import SshOptions

LOCAL = "{{name: {}, address: 127.0.0.1, connection: local}}"
REFUSING = "{{name: {}, address: 127.0.0.{}, port: 9}}"  # a port nobody listens on


def _contact(tmp_path: Path, *hosts: str) -> tuple[LostContact, list[str]]:
    path = tmp_path / "c.yaml"
    path.write_text("hosts:\n" + "".join(f"  - {host}\n" for host in hosts))
    loaded = inventory_module.load(path)
    said: list[str] = []
    session = Session(loaded, SshOptions(tmp_path / "known_hosts"))
    return LostContact(session, {h.name: h for h in loaded.hosts}, said.append), said


def _lost(node: str) -> NodeState:
    return NodeState(node, "unreachable", None, "connection lost while running")


def _until(contact: LostContact, running: set[str], limit_s: float = 10) -> Verdict:
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        verdict = contact.decide({}, running, stopping=False)
        if verdict.failed or verdict.resumed:
            return verdict
        time.sleep(0.1)
    raise AssertionError("no verdict")


def test_a_node_lost_while_another_is_heard_from_fails_at_once(tmp_path: Path) -> None:
    contact, said = _contact(tmp_path, REFUSING.format("n1", 1), REFUSING.format("n2", 2))
    contact.hold("n1", _lost("n1"), time.monotonic())
    lost_at = time.monotonic()
    # n2 not heard from since: the loss is not judged yet
    assert contact.decide({"n2": lost_at - 1}, {"n1", "n2"}, stopping=False) == Verdict()
    verdict = contact.decide({"n2": lost_at + 1}, {"n1", "n2"}, stopping=False)
    assert verdict.failed == {"n1": _lost("n1")} and not contact.held and not said
    assert not contact.cut_off


def test_every_node_lost_at_once_is_asked_again_and_followed_on(tmp_path: Path) -> None:
    contact, said = _contact(tmp_path, LOCAL.format("n1"), LOCAL.format("n2"))
    for node in ("n1", "n2"):
        contact.hold(node, _lost(node), time.monotonic())
    verdict = _until(contact, {"n1", "n2"})
    assert verdict.resumed == ["n1", "n2"] and not verdict.failed and not contact.held
    assert "lost contact with every node still running the job (n[1-2]) at once" in said[0]
    assert said[1].startswith("n[1-2]: answering again after ")
    assert not contact.cut_off


def test_a_node_still_silent_once_the_others_answer_is_taken_for_unreachable(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(lost_contact, "ALL_BACK_GRACE_S", 0.5)
    contact, said = _contact(tmp_path, LOCAL.format("n1"), REFUSING.format("n2", 2),
                             LOCAL.format("n3"))
    for node in ("n1", "n2"):  # n3's part had ended: it is asked all the same
        contact.hold(node, _lost(node), time.monotonic())
    verdict = _until(contact, {"n1", "n2"})
    assert verdict.resumed == ["n1"] and verdict.failed == {"n2": _lost("n2")}
    assert said[-1].startswith("n2: still no answer 0s after n[1,3] answered")


def test_a_stop_while_cut_off_waits_for_no_node(tmp_path: Path) -> None:
    contact, _ = _contact(tmp_path, REFUSING.format("n1", 1))
    contact.hold("n1", _lost("n1"), time.monotonic())
    assert contact.decide({}, {"n1"}, stopping=False) == Verdict() and contact.cut_off
    verdict = contact.decide({}, {"n1"}, stopping=True)
    assert verdict.failed == {"n1": _lost("n1")} and not contact.cut_off


def test_a_node_silent_while_another_was_heard_from_fails_at_once(tmp_path: Path) -> None:
    """A node dropped for its silence (a power-off: no FIN, no RST) while the others
    were heard from meanwhile: no need to wait for them to be heard again."""
    contact, _ = _contact(tmp_path, REFUSING.format("n1", 1), REFUSING.format("n2", 2))
    now = time.monotonic()
    contact.hold("n1", _lost("n1"), now - 10)  # silent for 10 s
    verdict = contact.decide({"n2": now - 1}, {"n1", "n2"}, stopping=False)
    assert verdict.failed == {"n1": _lost("n1")}
    # Cut off at once, the nodes went silent within a heartbeat of each other: n1 is
    # not judged gone for n2's last heartbeat a second after its own
    contact.hold("n1", _lost("n1"), now - 10)
    assert contact.decide({"n2": now - 9}, {"n1", "n2"}, stopping=False) == Verdict()
    assert contact.held and not contact.cut_off
