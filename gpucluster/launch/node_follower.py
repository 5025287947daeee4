"""One node's part of a followed job: its log streamed into the controller's copy and
to the caller, its heartbeats, and its state once its part has ended."""

from __future__ import annotations

import queue
import threading
import time
from collections import deque
from pathlib import Path

from gpucluster import reports
from gpucluster.inventory import Host
from gpucluster.launch import node_scripts
from gpucluster.launch.bar_draws import BarDraws, Shown
from gpucluster.launch.jobs import JobRecord
from gpucluster.launch.log_copy import LogCopy, NoCopy
from gpucluster.launch.model import (
    NodeState,
    OutputCallback,
    OutputClosed,
    Progress,
    parse_state,
)
from gpucluster.launch.tee_lines import ranked
from gpucluster.remote.result import RemoteError
from gpucluster.remote.session import Session

FOLLOW_LIMIT_S = 30 * 24 * 3600.0  # a job may run for weeks; heartbeats catch dead nodes
# A node's part of the job is over and nothing of it is left to write to its log.
FINAL_STATES = ("exited", "stopped")
# Where another gpucluster writes the copy, this follower's own last lines of the log
# (enough for torchrun's report and the failing rank's last traceback).
OWN_TAIL_LINES = 5000


class NodeFollower:
    """One node's log, streamed into the controller's copy and to the caller."""

    def __init__(self, session: Session, host: Host, record: JobRecord, log: Path,
                 follow: bool, on_output: OutputCallback | None,
                 done: queue.SimpleQueue[tuple[str, NodeState | None]], cap_bytes: int,
                 output_closed: threading.Event, from_byte: int = 0,
                 shown: int = 0) -> None:
        self.session, self.host, self.record = session, host, record
        self.from_byte = from_byte  # past 0: the log's end only, and no copy of it
        # Lines of the log a follow before this one passed on already (its connection
        # was lost): copied again, not passed on again.
        self.shown, self.lines = shown, 0
        self.log, self.follow, self.on_output, self.done = log, follow, on_output, done
        self.output_closed = output_closed  # shared: the output's reader went away
        self.cap_bytes = cap_bytes
        self.last_heard = time.monotonic()
        self.heard = False  # anything came from the node (a connection that worked)
        self.dropped_at = 0.0  # its connection last closed here for its silence
        self.last_progress = time.monotonic()  # output, or a newer heartbeat file
        self.progressed = False  # any progress yet (imports and rendezvous make none)
        self.heartbeat_mtime = ""
        self.heartbeat: Progress | None = None
        self.state: NodeState | None = None
        self.state_said = ""  # the node's own words for it, kept with a final copy
        self.copy_cut = ""  # why the controller's copy of the log stopped short, if it did
        # The log's last lines as this follower read them, kept where another process
        # writes the copy (an attached launch stopped with Ctrl-Z while `jobs` reads a
        # failure): that copy may be far behind the log.
        self.own_tail: deque[str] | None = None
        # Followed live, a progress bar's draws are thinned for the caller; else each
        # line is passed on as the log has it.
        self.draws = BarDraws() if follow else None

    def start(self) -> None:
        threading.Thread(target=self._run, daemon=True).start()

    def again(self) -> NodeFollower:
        """A follower of the same log, for one whose connection was lost: it copies the
        log again from where this one began, and passes on the lines this one had not."""
        return NodeFollower(self.session, self.host, self.record, self.log, self.follow,
                            self.on_output, self.done, self.cap_bytes, self.output_closed,
                            self.from_byte, shown=self.lines)

    def _run(self) -> None:
        copy = LogCopy(self.log, self.cap_bytes) if not self.from_byte else NoCopy()
        stamping = False  # the log and its state have come: the rest is its stamps
        try:
            def on_line(stream: str, line: str) -> None:
                nonlocal stamping
                self.last_heard, self.heard = time.monotonic(), True
                if stamping:
                    if stream == "stdout":
                        copy.stamp(line)
                    return
                kind, rest = reports.parse(line) or ("", "")
                if kind == "alive" and stream == "stderr":
                    copy.flush()  # a quiet job's last lines reach the disk within a beat
                    if self.draws is not None:
                        self._pass_on(self.draws.due())
                    mtime, step = [*rest.split(), "", ""][:2]
                    if mtime not in ("", "-") and rest.strip() != self.heartbeat_mtime:
                        self.heartbeat_mtime = rest.strip()  # a new mtime or step
                        self.last_progress, self.progressed = time.monotonic(), True
                        self._beat(int(step) if step.isdigit() else None)
                    return
                if kind == "state":
                    self.state, self.state_said = parse_state(self.host.name, rest), rest
                    return
                if kind == "caught-up" and stream == "stdout":
                    copy.caught_up()  # the log as it was at the start has come
                    return
                if kind == "times" and self.state is not None:
                    stamping = True
                    return
                self._copy(copy, line)
                self.lines += 1
                if self.lines <= self.shown:  # passed on by the follow before this one
                    return
                for piece in ranked(line):
                    # A rank's own line is progress; torchrun's (its start-up warnings,
                    # printed before the workers have even imported torch) is not, else
                    # the hang timer would be armed during the imports.
                    if piece.rank is not None:
                        self.last_progress, self.progressed = time.monotonic(), True
                    self._pass_on(self.draws.take(piece) if self.draws is not None
                                  else [(piece.rank, piece.text)])

            self.session.connection(self.host).run(
                node_scripts.follow_script(self.record, self.host.name, self.follow,
                                           from_byte=self.from_byte),
                timeout=FOLLOW_LIMIT_S if self.follow else 120, on_line=on_line)
            state = self.state or NodeState(self.host.name, "lost", None,
                                            "the log ended without a state")
        except RemoteError as error:
            state = self.state or NodeState(self.host.name, "unreachable", None,
                                            error.message)
        except Exception as error:  # else the wait for this node's end would never end
            state = self.state or NodeState(self.host.name, "lost", None,
                                            f"following its log failed: {error!r}")
        finally:
            if self.draws is not None:  # a bar's last draw, before the node's end is told
                self._pass_on(self.draws.rest())
            # A node that no longer has the job (its work dir wiped, the node re-imaged)
            # sends no log: the controller's copy is all that is left, so it is kept.
            ended = self.state is not None and self.state.state in FINAL_STATES
            copy.close(answered=self.state is not None and self.state.state != "missing",
                       ended=self.state_said if ended else "")
        self.copy_cut = copy.cut
        self.done.put((self.host.name, state))

    def _copy(self, copy: LogCopy, line: str) -> None:
        """Into the controller's copy; where another process writes it, into this
        follower's own tail too."""
        copy.write(line)
        if copy.elsewhere:
            if self.own_tail is None:
                self.own_tail = deque(maxlen=OWN_TAIL_LINES)
            self.own_tail.append(line)

    def _pass_on(self, shown: Shown) -> None:
        for rank, text in shown:
            if self.on_output is None or self.output_closed.is_set():
                return
            try:
                self.on_output(self.host.name, rank, text)
            except OutputClosed:  # the copy goes on; follow() decides the rest
                self.output_closed.set()

    def _beat(self, step: int | None) -> None:
        now = time.time()
        if self.heartbeat is None:
            self.heartbeat = Progress(now, now, step, step)
        else:
            self.heartbeat.last_at = now
            if step is not None:
                self.heartbeat.last_step = step
                if self.heartbeat.first_step is None:
                    self.heartbeat.first_step = step
