"""The controller's copy of a node's log while a job is followed: capped, rotated, with
each line's stamp; a copy that cannot be written stops short without stopping the job.
One process writes it at a time, and a copy written again replaces the one before only
once it holds as much: a follow cut short (Ctrl-C) leaves the copy before whole."""

from __future__ import annotations

import contextlib
import fcntl
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, TextIO

from gpucluster.launch.logsearch import ROTATED_SUFFIX, TIMES_SUFFIX

# The copy reaches the disk this often while lines come (and at each heartbeat, and at
# its end): a flush per line cost a write per line, 800000 of them for one job's logs.
FLUSH_EVERY_S = 0.2


def _beside(log: Path, suffix: str) -> Path:
    """A file of the copy's own, without ".log" in its name: not taken for a copy."""
    return log.with_name(f"{log.name.removesuffix('.log')}.{suffix}")


@dataclass(frozen=True)
class Ending:
    """How the job ended on a copy's node, written beside a copy made final: one made
    whole after the job had ended there, whose log can no longer change."""

    state: str  # the node's own words, `@@gpc state`'s: "exited 0 1733400000.25"
    whole: bool  # every line of the log is in the copy (none rotated out of it)


def ending(log: Path) -> Ending | None:
    """The copy's ending when it is final, else None (and for a marker that is not one of
    ours, such as the empty one of a version before: the node is asked again)."""
    try:
        if not log.exists():
            return None
        said = json.loads(_beside(log, "ended").read_text(encoding="utf-8"))
        state, whole = said["state"], said["whole"]
    except (OSError, ValueError, TypeError, KeyError):
        return None
    if not isinstance(state, str) or not state or not isinstance(whole, bool):
        return None
    return Ending(state, whole)


class LogCopy:
    """The controller's copy of a node's log, kept under `cap_bytes`: past half of it,
    the copy becomes NODE.log.1 (replacing the one before) and a new one begins. The
    node's stamps (node.times, one per line of its node.log) are split the same way.

    Where a copy is there already, the new one is written beside it (NODE.part, and
    NODE.1.part once it rotates) until it has caught up with the node's log as it was
    when the follow began (`caught_up`), or has all of it (`close`); then it takes its
    place and goes on there, where readers of a running job's copy look. Another
    gpucluster writing this copy (an attached launch while `logs` runs) leaves it to
    that one."""

    def __init__(self, log: Path, cap_bytes: int) -> None:
        self.log, self.half = log, max(cap_bytes // 2, 1)
        self.rotated = log.with_name(log.name + ROTATED_SUFFIX)
        self._part, self._rotated_part = _beside(log, "part"), _beside(log, "1.part")
        self._lock_path, self._ended = _beside(log, "copy-lock"), _beside(log, "ended")
        self._lock: BinaryIO | None = None
        # Opened by the first line: a node that cannot be reached leaves the old copy be.
        self.file: TextIO | None = None
        self.size = self.lines = 0  # of the current copy
        self.in_rotated = 0  # lines in NODE.log.1
        self.dropped = 0  # lines gone with an overwritten NODE.log.1
        self.stamped = 0  # stamps seen, one per line of the node's log from its first
        self.stamps: list[str] = []  # those of the lines kept (NODE.log.1's, then NODE.log's)
        self.cut = ""  # why the copy stopped short (the controller's disk full), if it did
        self.elsewhere = False  # another process writes this copy: this one writes none
        self._beside = False  # written beside the copy before, which it has not caught up
        self._flushed_at = time.monotonic()

    def write(self, line: str) -> None:
        if self.cut or self.elsewhere:
            return
        try:
            self._write(line)
        except OSError as error:
            self._give_up(error)

    def _give_up(self, error: OSError) -> None:
        """The copy stops here, and only the copy: the job, its streaming and its end go
        on (a follower that died of it left launch waiting for ever). The node keeps
        the whole log, for `gpucluster logs` to fetch."""
        self.cut = error.strerror or str(error)  # the same for every node: said once
        if self.file is not None:
            with contextlib.suppress(OSError):  # its flush fails; the file is closed anyway
                self.file.close()

    def _write(self, line: str) -> None:
        if self.file is None:
            if not self._take_lock():
                return
            self._beside = self.log.exists() or self.rotated.exists()
            self._rotated_part.unlink(missing_ok=True)  # of a copy cut short before
            if not self._beside:
                self.rotated.unlink(missing_ok=True)
            self.file = self._current().open("w", encoding="utf-8")
        if self.size >= self.half:
            self.file.close()
            self._current().replace(self._rotated_part if self._beside else self.rotated)
            self.dropped += self.in_rotated
            self.in_rotated, self.lines = self.lines, 0
            self.file, self.size = self._current().open("w", encoding="utf-8"), 0
        self.file.write(line + "\n")
        self.size += len(line.encode()) + 1
        self.lines += 1
        if time.monotonic() - self._flushed_at >= FLUSH_EVERY_S:
            self.flush()

    def _take_lock(self) -> bool:
        """This copy's writer: the first process to ask (locks go with the process)."""
        self._lock = self._lock_path.open("ab")
        try:
            fcntl.flock(self._lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self._lock.close()
            self._lock, self.elsewhere = None, True
            return False
        return True

    def _current(self) -> Path:
        return self._part if self._beside else self.log

    def caught_up(self) -> None:
        """Every line the node's log had when the follow began has come: this copy holds
        all the one before did, and replaces it."""
        if self._beside and not self.cut:
            try:
                self._take_place()
            except OSError as error:
                self._give_up(error)

    def _take_place(self) -> None:
        """This copy replaces the one before, and goes on being written where it now
        is."""
        if self.file is not None and not self.file.closed:
            self.file.flush()
        self._ended.unlink(missing_ok=True)  # said again at the end, if so
        if self._rotated_part.exists():
            self._rotated_part.replace(self.rotated)
        elif not self.in_rotated:
            self.rotated.unlink(missing_ok=True)  # this copy has no older half
        self._part.replace(self.log)
        self._beside = False

    def flush(self) -> None:
        """What was written so far, to the disk (a heartbeat from the node calls it)."""
        self._flushed_at = time.monotonic()
        if self.file is None or self.cut:
            return
        try:
            self.file.flush()
        except OSError as error:
            self._give_up(error)

    def stamp(self, stamp: str) -> None:
        """The next line's stamp, once the log has come whole: only the kept lines' are
        kept (a job's log may have had millions of lines)."""
        if self.dropped <= self.stamped < self.dropped + self.in_rotated + self.lines:
            self.stamps.append(stamp)
        self.stamped += 1

    def close(self, answered: bool, ended: str = "") -> None:
        """`answered`: the node sent its whole log (maybe none): the copy is that.
        `ended`: and the job had ended there, as the node said so: the copy is final."""
        try:
            if not self.cut and not self.elsewhere:
                self._close(answered)
                if answered and ended:
                    self._ended.write_text(json.dumps(
                        {"state": ended, "whole": not self.dropped}), encoding="utf-8")
                elif answered:
                    self._ended.unlink(missing_ok=True)
        except OSError as error:
            self._give_up(error)
        finally:
            if self._lock is not None:
                self._lock.close()  # and the lock with it
                self._lock = None

    def _close(self, answered: bool) -> None:
        if self.file is None:
            if not answered or not self._take_lock():
                return
            self.rotated.unlink(missing_ok=True)
            self.log.write_text("", encoding="utf-8")
        else:
            self.file.close()
            if self._beside:  # the copy before stays, unless this one came whole
                if not answered:
                    for unfinished in (self._part, self._rotated_part):
                        unfinished.unlink(missing_ok=True)
                    return
                self._take_place()
        if not answered:  # the stamps come after the log: those of before stay
            return
        rotated, current = self.stamps[:self.in_rotated], self.stamps[self.in_rotated:]
        for path, part in ((self.rotated, rotated), (self.log, current)):
            if part or path.exists():
                path.with_name(path.name + TIMES_SUFFIX).write_text(
                    "".join(f"{stamp}\n" for stamp in part), encoding="utf-8")


class NoCopy(LogCopy):
    """No copy: a follow of a log's end only (`logs -f -n`) leaves the controller's copy
    of the whole log as it was."""

    def __init__(self) -> None:
        super().__init__(Path("/dev/null"), 1)

    def write(self, line: str) -> None:
        pass

    def flush(self) -> None:
        pass

    def stamp(self, stamp: str) -> None:
        pass

    def close(self, answered: bool, ended: str = "") -> None:
        pass
