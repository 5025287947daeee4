"""The values of a job's life: what to launch, each node's state, what stop found,
the first failure and the outcome of following a job."""

from __future__ import annotations

import signal
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from gpucluster.doctor.model import CheckResult
from gpucluster.errors import GpuclusterError
from gpucluster.launch.jobs import JobRecord
from gpucluster.launch.known_causes import KnownCause

DEFAULT_GRACE_S = 10.0

OutputCallback = Callable[[str, str | None, str], None]  # node, rank, text


class OutputClosed(BrokenPipeError):
    """An OutputCallback's reader went away (`launch ... | head` once head has its
    lines): a job the caller owns is stopped, as Ctrl-C stops it; anyone else stops
    following. A BrokenPipeError, so what is not caught ends the CLI quietly."""


class LaunchRefused(GpuclusterError):
    """A check found the cluster not ready; `findings` say where and how to fix it."""

    exit_code = 1

    def __init__(self, message: str, findings: Sequence[CheckResult] = ()) -> None:
        super().__init__(message)
        self.findings = tuple(findings)


@dataclass(frozen=True)
class LaunchRequest:
    script: str
    args: tuple[str, ...]
    workdir: Path
    nproc_per_node: int | None = None
    max_restarts: int = 0
    env: Mapping[str, str] = field(default_factory=dict)
    image: str | None = None
    attempt: int = 1  # launch --recover: this attempt's number
    run: str | None = None  # launch --recover: the run the attempt belongs to
    debug: bool = False  # launch --debug: NCCL's and torch's diagnostics into the job dir
    secret_env: frozenset[str] = frozenset()  # names in env whose values are never kept
    module: bool = False  # launch -m: script is a module name, run as python -m would
    # A node whose torchrun fails stops the job on the others itself, with this grace
    # (TERM, then KILL); None: it never does. At once under launch -d (after 0 s); where
    # a launcher watches, only if that launcher's own stop did not come in this long
    # (its machine asleep, or cut off from the nodes).
    stop_peers_grace_s: float | None = None
    stop_peers_after_s: int = 0

    @property
    def nodes_stop_at_once(self) -> bool:
        """launch -d: nothing on the controller watches the job; its nodes stop it."""
        return self.stop_peers_grace_s is not None and not self.stop_peers_after_s


# An attached launch stops the job everywhere a second or two after a node's failure;
# its nodes wait this long for that stop before they do it themselves.
LAUNCHER_STOP_WAIT_S = 30


@dataclass(frozen=True)
class NodeState:
    node: str
    # running, exited, stopped, lost, missing, unreachable; leftover: torchrun ended while
    # processes of the job still ran there (its orphaned workers); stopping (`jobs`
    # only): a stop asked for it and processes of it are still there
    state: str
    exit_code: int | None = None
    detail: str = ""
    exited_at: float | None = None  # node clock, when torchrun exited
    # Its torchrun failed and its stop of the others (stop_peers.sh) left some running:
    # (peer, why) in that script's words: `Host key verification failed.`
    peers_left: tuple[tuple[str, str], ...] = ()
    # `jobs`: seconds since the job's newest output or heartbeat here (node clock), while
    # processes of it are here
    quiet_s: int | None = None

    @property
    def failed(self) -> bool:
        # A leftover whose torchrun exited 0 (a process the script left behind) is no
        # failure of the job: stopping the others then could cut their last steps short.
        return self.state in ("lost", "unreachable") or (
            self.state in ("exited", "leftover") and self.exit_code != 0)

    @property
    def label(self) -> str:
        """running, stopped, lost...; exited with its code (a stopped torchrun's own exit
        code says nothing: it is how TERM ended it)."""
        if self.state == "exited":
            return f"exited {self.exit_code}"
        if self.state == "leftover":  # torchrun gone, its workers not
            ended = "ended" if self.exit_code is None else f"exited {self.exit_code}"
            return f"{ended} leaving processes"
        return self.state

    @property
    def leftover_cause(self) -> str:
        """A `leftover` node's failure in words: how torchrun ended, and what it left."""
        code = self.exit_code
        if code is None:  # its wrapper, which records the exit code, went with it
            ended = "the job's leader was killed"
        elif code > 128:
            ended = f"torchrun was killed by {signal_words(code - 128)}"
        else:
            ended = f"torchrun exited {code}"
        return f"{ended} while processes of the job still ran there"


def signal_words(number: int) -> str:
    """`signal 9 (SIGKILL)`."""
    try:
        return f"signal {number} ({signal.Signals(number).name})"
    except ValueError:
        return f"signal {number}"


@dataclass(frozen=True)
class StopResult:
    node: str
    found: int  # processes of the job found
    how: str  # none, term, kill, unreachable
    left: tuple[int, ...] = ()  # pids still there afterwards (should be none)
    detail: str = ""
    # A stop that aborted the workers first (a hang's): each rank's faulthandler dump,
    # empty for one that wrote none (hang_stacks reads them), and how the rank ended:
    # died, stopped or alive (empty: a node script that did not say).
    stacks: Mapping[int, tuple[str, ...]] = field(default_factory=dict)
    stack_fates: Mapping[int, str] = field(default_factory=dict)
    # py-spy's read of each rank as it was held before the abort, where the node has
    # py-spy: where a rank without a dump of its own was
    spied: Mapping[int, tuple[str, ...]] = field(default_factory=dict)

    @property
    def confirmed(self) -> bool:
        """The node answered and nothing of the job is left on it."""
        return self.how not in ("unreachable", "error") and not self.left


@dataclass(frozen=True)
class FirstFailure:
    node: str
    state: NodeState
    rank: int | None
    exit_code: int | None  # torchrun's; the failing worker's is in `worker_exit`
    tail: tuple[str, ...]
    worker_exit: int | None = None  # negative: killed by that signal
    failed_at: str = ""  # torchrun's root-cause time (second resolution)
    rank_tail: tuple[str, ...] = ()  # the failing rank's own last lines
    cause: KnownCause | None = None  # what its lines say, where they say a known cause
    rank_error: tuple[str, ...] = ()  # the failing rank's last traceback, wherever it stands

    @property
    def error_came_before(self) -> bool:
        """Its last traceback's exception line is not among its last lines: more of its
        output came after it (torchrun copies stdout and stderr apart)."""
        return bool(self.rank_error) and not any(line.endswith(self.rank_error[-1])
                                                 for line in self.rank_tail)

    @property
    def killing_signal(self) -> str | None:
        """`signal 9 (SIGKILL)` when the failing worker was killed by one."""
        if self.worker_exit is None or self.worker_exit >= 0:
            return None
        return signal_words(-self.worker_exit)

    def order(self) -> tuple[str, int, float]:
        """Earliest root cause first; within the same second a worker killed by a signal
        (the OOM killer, a segfault) before peers that errored because it vanished; then
        the time torchrun exited."""
        return (self.failed_at or "~", 0 if (self.worker_exit or 0) < 0 else 1,
                self.state.exited_at or float("inf"))


@dataclass
class Progress:
    """A node's heartbeat as the controller saw it: the first and last step the script
    wrote in its heartbeat file (None when it only touches it), and when (controller
    clock) the first and last touch arrived."""

    first_at: float
    last_at: float
    first_step: int | None = None
    last_step: int | None = None


@dataclass
class JobOutcome:
    record: JobRecord
    states: dict[str, NodeState] = field(default_factory=dict)
    first_failure: FirstFailure | None = None
    stopped: dict[str, StopResult] = field(default_factory=dict)
    interrupted: bool = False
    hang: str = ""  # why the job was taken for hung (no progress), else empty
    progress: dict[str, Progress] = field(default_factory=dict)  # nodes with a heartbeat
    # Nodes whose copy of the log here stopped short, and why (the controller's disk full)
    copies_cut: dict[str, str] = field(default_factory=dict)

    @property
    def exit_code(self) -> int:
        if self.interrupted:
            return 130
        if self.first_failure is not None:
            code = self.first_failure.exit_code
            return code if code is not None and 0 < code < 128 else 1
        # A leftover after an exit 0: the job succeeded (launch ends what it left)
        if any(s.state not in ("exited", "leftover") or s.exit_code != 0
               for s in self.states.values()):
            return 1
        return 0


def parse_state(node: str, rest: str) -> NodeState:
    """"STATE CODE [EXIT_TIME]" as the node scripts print it; CODE is - when unknown."""
    state, code, when = [*rest.split(), "", "", ""][:3]
    exit_code = int(code) if code.lstrip("-").isdigit() else None
    try:
        exited_at = float(when) if when else None
    except ValueError:
        exited_at = None
    return NodeState(node, state or "lost", exit_code, exited_at=exited_at)
