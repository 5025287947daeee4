"""A node that died, told apart from this machine losing its network. A node whose
connection is lost while the job runs is held, not failed, until another node of the
job is heard from after it (the node is gone: it fails, and fail-fast stops the job as
before) or every node still running is lost too (most likely this machine: the job goes
on there). Then each is asked again every few seconds; the ones that answer are
followed on, and one still silent once the others are back, or all of them after
CUT_OFF_LIMIT_S, fails as unreachable.

Seen on the sandbox: 40 s without the controller's network ended an attached launch
with `first failure: node1, unreachable`, its stop unable to reach any node, and the
healthy job left running on every node with nobody following it."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from gpucluster import hostrange
from gpucluster.inventory import Host
from gpucluster.launch.model import NodeState
from gpucluster.launch.node_scripts import HEARTBEAT_S
from gpucluster.remote.result import RemoteError
from gpucluster.remote.session import Session

RECONNECT_EVERY_S = 5.0
CUT_OFF_LIMIT_S = 600.0  # this long without any node: they are taken for unreachable
ALL_BACK_GRACE_S = 15.0  # once one node answers again, the others' time to answer too
ANSWER_TIMEOUT_S = 15.0  # a node's answer to `true` once connected
# Nodes cut off at once went silent within a heartbeat of each other (2 s), give or take
# the link's delays: a node heard from later than this after another's last sign of
# life means that one went silent alone.
SILENCE_SLACK_S = 2 * HEARTBEAT_S


@dataclass
class Verdict:
    """What the follow does now: `failed` nodes end with these states; `resumed` ones are
    followed again."""

    failed: dict[str, NodeState] = field(default_factory=dict)
    resumed: list[str] = field(default_factory=list)


class LostContact:
    """The nodes whose connection was lost while the job ran, and what to make of it."""

    def __init__(self, session: Session, hosts: Mapping[str, Host],
                 say: Callable[[str], None]) -> None:
        self.session, self.hosts, self.say = session, hosts, say
        # node -> its state, and since when it is given up: the earlier of its loss and
        # its last sign of life plus SILENCE_SLACK_S
        self.held: dict[str, tuple[NodeState, float]] = {}
        self.cut_off_since: float | None = None
        self._answered: dict[str, float] = {}  # node -> when it answered again
        self._lock = threading.Lock()
        self._waiting = threading.Event()  # set: the reconnecting threads stop

    @property
    def cut_off(self) -> bool:
        return self.cut_off_since is not None

    def hold(self, node: str, state: NodeState, last_heard: float) -> None:
        """`node` lost, last heard from at `last_heard` (time.monotonic())."""
        self.held[node] = (state, min(time.monotonic(), last_heard + SILENCE_SLACK_S))

    def decide(self, heard: Mapping[str, float], running: set[str],
               stopping: bool) -> Verdict:
        """`heard`: when each node followed was last heard from; `running`: the nodes
        whose part of the job has not ended (held ones included)."""
        if not self.held:
            return Verdict()
        if stopping:  # a stop reaches who it can; nothing is waited for
            return self._fail(list(self.held))
        now = time.monotonic()
        if self.cut_off_since is None:
            # Another node heard from since: this machine's network works, so it is the
            # node. (A node dropped as silent was silent for long: the others heard from
            # meanwhile judge it at once.)
            given_up = min(when for _, when in self.held.values())
            if any(when > given_up for node, when in heard.items() if node not in self.held):
                return self._fail(list(self.held))
            if running <= set(self.held):
                self._cut_off(now)
            return Verdict()
        with self._lock:
            answered = dict(self._answered)
        if answered and (set(self.held) <= set(answered)
                         or now - min(answered.values()) > ALL_BACK_GRACE_S):
            return self._back(answered, now)  # the held ones that answered go on
        if now - self.cut_off_since > CUT_OFF_LIMIT_S:
            self.say(f"{hostrange.fold(self.held)}: no answer for {CUT_OFF_LIMIT_S:.0f}s: "
                     f"taken for unreachable")
            return self._fail(list(self.held))
        return Verdict()

    def _cut_off(self, now: float) -> None:
        self.cut_off_since = now
        self._waiting.clear()
        self.say(f"lost contact with every node still running the job "
                 f"({hostrange.fold(self.held)}) at once: most likely this machine's "
                 f"network, not the nodes; the job goes on there. Asking again every "
                 f"{RECONNECT_EVERY_S:.0f}s for up to {CUT_OFF_LIMIT_S / 60:.0f} minutes "
                 f"(Ctrl-C stops waiting and stops the job where it can)")
        # Every node of the job is asked: one that answers while the held ones do not
        # says this machine's network is back and those nodes are gone.
        for node in self.hosts:
            threading.Thread(target=self._reconnect, args=(node,), daemon=True).start()

    def _reconnect(self, node: str) -> None:
        connection = self.session.connection(self.hosts[node])
        while not self._waiting.is_set():
            asked = time.monotonic()
            connection.close()  # its transport died with the link
            try:
                connection.run("true", timeout=ANSWER_TIMEOUT_S)
            except RemoteError:
                self._waiting.wait(max(RECONNECT_EVERY_S - (time.monotonic() - asked), 0.5))
                continue
            with self._lock:
                self._answered[node] = time.monotonic()
            return

    def _back(self, answered: Mapping[str, float], now: float) -> Verdict:
        assert self.cut_off_since is not None
        resumed = [node for node in self.held if node in answered]
        silent = [node for node in self.held if node not in answered]
        if resumed:
            self.say(f"{hostrange.fold(resumed)}: answering again after "
                     f"{now - self.cut_off_since:.0f}s; following the job on")
        if silent:
            self.say(f"{hostrange.fold(silent)}: still no answer "
                     f"{ALL_BACK_GRACE_S:.0f}s after {hostrange.fold(answered)} answered: "
                     f"taken for unreachable")
        for node in resumed:
            del self.held[node]
        verdict = self._fail(silent)
        verdict.resumed = resumed
        return verdict

    def _fail(self, nodes: list[str]) -> Verdict:
        failed = {node: self.held.pop(node)[0] for node in nodes}
        if not self.held:
            self.cut_off_since = None
            self._waiting.set()
            with self._lock:
                self._answered.clear()
        return Verdict(failed=failed)
