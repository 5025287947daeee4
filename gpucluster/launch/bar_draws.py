"""A progress bar in a job's live view: each rank's draws (tqdm redraws ten times a
second) shown at most once every few seconds, and the last one before the rank's next
line always, as the bar stood; what torchrun's tee makes of a bar's carriage returns
(empty lines of the rank) left out. The node's log keeps every draw."""

from __future__ import annotations

import re
import time
from collections.abc import Callable

from gpucluster.launch.tee_lines import Piece, ranked

DRAW_EVERY_S = 5.0  # live, a rank's bar is shown moving this often at most
# What changes from one draw of a bar to the next: its figures (tqdm's times, "?" while
# unknown) and the bar itself (tqdm's ascii and unicode bars, rich's), left out to tell
# a draw by what remains.
_MOVING = str.maketrans("", "", "0123456789.:? #▏▎▍▌▋▊▉█━╸╺")
Shown = list[tuple[str | None, str]]  # (rank, text) of lines to show, in order
# The tee's header of a rank, inside a line: right behind text ("Epoch [1]:" is a rank's).
_HEADER_INSIDE = re.compile(r"(?<=\S)\[(\d+)\]:")


class BarDraws:
    """One node's lines on their way to the live view, its ranks' bar draws thinned.

    What the tee writes for a bar is `[r]:` (the \\r that begins it, read as the end of
    an empty line), then each draw with the next \\r glued on; a line the rank prints
    while its bar is open comes glued to the draw, and what ends the draw comes after
    it as an empty line. Those empty lines are left out: one right before a draw (a
    bar's start; an empty print just then goes with it), and the one that ends a draw
    something was glued to. Any other empty line is shown, before the rank's next line.

    The tee reads a draw whole when the \\r after it had come by then (draws a tenth of
    a second apart, and its reads as far apart): such a draw is told by being like the
    rank's last draw but for its figures and bar (a line printed between them is not
    one: a bar goes on after it, or the next begins). So is another rank's line glued
    to a draw (tee_lines cuts a line only where its own rank's header comes again: to
    cut at any rank's, "x[3]: 0.5" would be rank 3's line): where what is before the
    other rank's header is like the rank's last draw."""

    def __init__(self, every_s: float = DRAW_EVERY_S,
                 clock: Callable[[], float] = time.monotonic, live: bool = True) -> None:
        """Not `live` (every draw shown: every_s=0), an empty line is passed on as it
        comes, where the log has it (`logs -n` counts a log's last lines, and the merge
        of several nodes' keeps each one's order), but the tee's: once a rank drew a
        bar, an empty line of its is taken for the \r of its next draw."""
        self.every_s, self._clock, self._live = every_s, clock, live
        self._held: dict[str, str] = {}  # rank -> its newest draw not shown
        self._shown_at: dict[str, float] = {}  # rank -> when its draw was last shown
        self._empty: set[str] = set()  # ranks with an empty line waiting for what follows
        self._unended: set[str] = set()  # ranks with a draw whose end is yet to come
        self._drawing: dict[str, str] = {}  # rank -> its last draw's shape
        self._line: dict[str, str] = {}  # rank -> its last line

    def take(self, piece: Piece) -> Shown:
        """What to show now for this piece of the node's log."""
        rank, text = piece.rank, piece.text
        if text and not piece.drawn and rank not in self._drawing and rank not in self._empty \
                and rank is not None:  # a line of a rank that drew no bar: most lines
            self._line[rank] = text
            return [(rank, text)]
        glued_at = self._glued_to_draw(piece)
        if piece.rank is None or glued_at is None:
            return self._take(piece)
        shown = self._draw(piece.rank, piece.text[:glued_at], ends_later=True)
        return shown + [line for later in ranked(piece.text[glued_at:])
                        for line in self._take(later)]

    def _glued_to_draw(self, piece: Piece) -> int | None:
        """Where another rank's line begins, glued to a draw of the piece's rank."""
        shape = self._drawing.get(piece.rank) if piece.rank is not None else None
        if shape is None or "]:" not in piece.text:
            return None
        for header in _HEADER_INSIDE.finditer(piece.text):
            if header.group(1) != piece.rank and _shape(piece.text[:header.start()]) == shape:
                return header.start()
        return None

    def _take(self, piece: Piece) -> Shown:
        rank, text = piece.rank, piece.text
        if rank is None:  # torchrun's own: a failure summary numbers failures "[r]:"
            self._unended.clear()
            self._drawing.clear()
            return [*self.rest(), (None, text)]
        if not text and not piece.drawn:
            return self._empty_line(rank)
        shape = self._drawing.get(rank)
        if piece.drawn or (shape is not None and (not text.strip() or _shape(text) == shape)):
            return self._draw(rank, text, piece.ends_later)
        shown = self._held_draw(rank)  # the bar as it stood when this line came
        if rank in self._empty:
            self._empty.discard(rank)
            shown.append((rank, ""))
        self._line[rank] = text
        return [*shown, (rank, text)]

    def due(self) -> Shown:
        """Held draws whose rank was not shown for `every_s` (a bar that stopped moving
        shows where it stopped)."""
        now = self._clock()
        ranks = [r for r in self._held
                 if now - self._shown_at.get(r, float("-inf")) >= self.every_s]
        return [line for rank in ranks for line in self._held_draw(rank)]

    def rest(self) -> Shown:
        """Everything held, at the end of the node's lines."""
        held = [line for rank in list(self._held) for line in self._held_draw(rank)]
        empties: Shown = [(rank, "") for rank in sorted(self._empty, key=int)]
        self._empty.clear()
        return held + empties

    def _draw(self, rank: str, text: str, ends_later: bool) -> Shown:
        if ends_later:
            self._unended.add(rank)
        self._empty.discard(rank)  # the \r that began the bar
        if not text.strip():  # the bar cleared (tqdm does, to print beside it)
            return []
        shape = _shape(text)
        if rank not in self._drawing and _shape(self._line.get(rank, "")) == shape:
            self._shown_at[rank] = self._clock()  # the bar's first draw, read whole, shown
        self._drawing[rank] = shape
        if self._clock() - self._shown_at.get(rank, float("-inf")) < self.every_s:
            self._held[rank] = text
            return []
        self._held.pop(rank, None)
        return [self._show(rank, text)]

    def _empty_line(self, rank: str) -> Shown:
        if rank in self._unended:  # what ended the draw the rank's last line came after
            self._unended.discard(rank)
            return []
        shown = self._held_draw(rank)  # the bar's last draw
        if not self._live:
            return shown if rank in self._drawing else [*shown, (rank, "")]
        if rank in self._empty:  # the one before was an empty line of the rank's own
            shown.append((rank, ""))
        else:
            self._empty.add(rank)
        return shown

    def _held_draw(self, rank: str) -> Shown:
        text = self._held.pop(rank, None)
        return [] if text is None else [self._show(rank, text)]

    def _show(self, rank: str, text: str) -> tuple[str, str]:
        self._shown_at[rank] = self._clock()
        return rank, text


def _shape(text: str) -> str:
    return text.translate(_MOVING)
