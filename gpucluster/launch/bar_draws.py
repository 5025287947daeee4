"""A progress bar in a job's live view: each rank's draws (tqdm redraws ten times a
second, Lightning's bar once a batch) shown at most once every few seconds, and the
last one before the rank's next line always, as the bar stood; what torchrun's tee
makes of a bar's carriage returns (empty lines of the rank) left out. The node's log
keeps every draw."""

from __future__ import annotations

import re
import time
from collections.abc import Callable

from gpucluster.launch.tee_lines import Piece, ranked

DRAW_EVERY_S = 5.0  # live, a rank's bar is shown moving this often at most
# A rank draws a bar once the tee read this many of its lines open in a row, alike, each
# within BAR_GAP_S of the one before; until BAR_GAP_S after the last, a line read whole
# that is alike is a draw too. A print is an open line as often as the tee reads it
# between its writes (a print's words and its newline are several: 72 of 40000 lines of
# a job's multi-argument prints), three in a row next to never; a bar's draws are open
# as often as the tee reads before the next one comes (tqdm's: 10 a second).
BAR_OPEN_DRAWS = 3
BAR_GAP_S = 2.0
# Between two open draws in a row, as many alike read whole (a bar drawn faster than the
# tee reads: 20 draws a second, one open at each read; a print is read open once in
# hundreds of lines).
BAR_WHOLE_BETWEEN = 4
# What only a bar's draw looks like: tqdm's "45%|" and its rate ("9.8it/s", "2.1s/it"),
# the bar of Lightning, Hugging Face's Trainer and accelerate (rich's and Keras's draw
# none into a file; Keras's "==>" would take torch's examples' "====> Epoch: 1" lines).
# Such a line read open is a draw at once (so is one read whole right after the rank's
# empty line: the \r of a bar's first draw), and once the rank drew one, such a line
# alike to it is a draw however read: Lightning's bar draws once a batch (100-500 a
# second: 10-50 read whole between two open ones), and a bar's draws wait out an
# epoch's validation and go on.
_BAR_LOOK = re.compile(r"\d%\||\d(?:it|s)/(?:s|it)\b")
# What changes from one draw of a bar to the next: its figures (tqdm's times, "?" while
# unknown) and the bar itself (tqdm's ascii and unicode bars, rich's), left out to tell
# a draw by what remains.
# (A pattern: str.translate deleting them took twice as long on a unicode bar's draw.)
_MOVING = re.compile("[0123456789.:? #▏▎▍▌▋▊▉█━╸╺]+")
Shown = list[tuple[str | None, str]]  # (rank, text) of lines to show, in order
# The tee's header of a rank, inside a line: right behind text ("Epoch [1]:" is a rank's).
_HEADER_INSIDE = re.compile(r"(?<=\S)\[(\d+)\]:")
# tqdm draws a bar below another (nested loops) a line down, "\n\r" and the draw, then
# goes back up to the first: each of its draws ends with a cursor move up.
CURSOR_UP = "\x1b[A"


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
        bar, an empty line of its is taken for the \\r of its next draw."""
        self.every_s, self._clock, self._live = every_s, clock, live
        self._held: dict[str, str] = {}  # rank -> its newest draw not shown
        self._shown_at: dict[str, float] = {}  # rank -> when its draw was last shown
        self._empty: set[str] = set()  # ranks with an empty line waiting for what follows
        self._unended: set[str] = set()  # ranks with a draw whose end is yet to come
        self._drawing: dict[str, str] = {}  # rank -> its last draw's shape
        # rank -> when it last drew a bar's draw: open, or one that looks like a bar's
        self._bar: dict[str, float] = {}
        # rank -> its open draws in a row, when the last came, alike lines read whole since
        self._opens: dict[str, tuple[int, float, int]] = {}
        self._shaped = ("", "")  # the text last shaped, and its shape

    def take(self, piece: Piece) -> Shown:
        """What to show now for this piece of the node's log."""
        rank, text = piece.rank, piece.text
        if text and not piece.drawn and rank not in self._drawing and rank not in self._empty \
                and rank is not None:  # a line of a rank that drew no bar: most lines
            return [(rank, text)]
        glued_at = None if rank is None else self._glued_to_draw(rank, text)
        if rank is None or glued_at is None:
            return self._take(piece)
        shown = self._draw(rank, text[:glued_at], ends_later=True, open_=True)
        return shown + [line for later in ranked(text[glued_at:]) for line in self._take(later)]

    def _glued_to_draw(self, rank: str, text: str) -> int | None:
        """Where another rank's line begins, glued to a draw of this rank's."""
        shape = self._drawing.get(rank)
        if shape is None or "]:" not in text:
            return None
        for header in _HEADER_INSIDE.finditer(text):
            if header.group(1) != rank and _shape(text[:header.start()]) == shape:
                return header.start()
        return None

    def _take(self, piece: Piece) -> Shown:
        rank, text = piece.rank, piece.text
        if rank is None:  # torchrun's own: a failure summary numbers failures "[r]:"
            self._unended.clear()
            self._drawing.clear()
            self._bar.clear()
            return [*self.rest(), (None, text)]
        if not text and not piece.drawn:
            return self._empty_line(rank)
        if piece.drawn or self._read_whole(rank, text):
            return self._draw(rank, text, piece.ends_later, piece.drawn)
        self._read_between(rank, text)
        shown = self._held_draw(rank)  # the bar as it stood when this line came
        if rank in self._empty:
            self._empty.discard(rank)
            if _looks_drawn(text):  # a bar's first draw, read whole after its \r
                return shown + self._draw(rank, text, ends_later=False, open_=False)
            shown.append((rank, ""))
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

    def _read_whole(self, rank: str, text: str) -> bool:
        """A draw of the rank's bar the tee read whole? Only while a bar is drawn (a
        print the tee read in two, "[0]:step 5 loss[0]: 0.1", is an open line too: it
        must not make the rank's every "step N loss X" after it a draw), or, once the
        rank drew a bar, a line that looks like a bar's."""
        drawing = self._drawing_bar(rank, self._clock())
        if not drawing and rank not in self._bar:  # most lines of a rank that drew none
            return False
        alike = _blank(text) or self._shape_of(text) == self._drawing.get(rank)
        return alike and (drawing or _looks_drawn(text))

    def _read_between(self, rank: str, text: str) -> None:
        """A line read whole, not (yet) a bar's draw: the open ones before it and after
        are not in a row unless it is alike, and one of few."""
        opens = self._opens.get(rank)
        if opens is None:
            return
        row, last, between = opens
        if between < BAR_WHOLE_BETWEEN and self._shape_of(text) == self._drawing.get(rank):
            self._opens[rank] = row, last, between + 1
        else:
            del self._opens[rank]

    def _drawing_bar(self, rank: str, now: float) -> bool:
        return now - self._bar.get(rank, float("-inf")) <= BAR_GAP_S

    def _draw(self, rank: str, text: str, ends_later: bool, open_: bool) -> Shown:
        if ends_later:
            self._unended.add(rank)
        self._empty.discard(rank)  # the \r that began the bar
        if _blank(text):  # the bar cleared (tqdm does, to print beside it, or at its end)
            return []
        shape, now = self._shape_of(text), self._clock()
        if open_:
            row, last, _ = self._opens.get(rank, (0, float("-inf"), 0))
            alike = self._drawing.get(rank) == shape and now - last <= BAR_GAP_S
            row = row + 1 if alike else 1
            self._opens[rank] = row, now, 0
            if row >= BAR_OPEN_DRAWS:
                self._bar[rank] = now
        if _looks_drawn(text):  # a bar's by its look, however read
            self._bar[rank] = now
        self._drawing[rank] = shape
        if not self._drawing_bar(rank, now):  # no bar yet (or a print read open): shown
            return [*self._held_draw(rank), self._show(rank, text)]
        if now - self._shown_at.get(rank, float("-inf")) < self.every_s:
            self._held[rank] = text
            return []
        self._held.pop(rank, None)
        return [self._show(rank, text)]

    def _shape_of(self, text: str) -> str:
        """_shape(text), the last one kept: a draw read whole is asked twice (is it a draw,
        then as one)."""
        if text is not self._shaped[0]:
            self._shaped = text, _shape(text)
        return self._shaped[1]

    def _empty_line(self, rank: str) -> Shown:
        if rank in self._unended:  # what ended the draw the rank's last line came after
            self._unended.discard(rank)
            return []
        if self._live and self._held.get(rank, "").endswith(CURSOR_UP):
            return []  # the \r of the next draw of a bar below another, a line down
        shown = self._held_draw(rank)  # the bar's last draw
        if not self._live:
            return shown if rank in self._bar else [*shown, (rank, "")]
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
    return _MOVING.sub("", text)


def _blank(text: str) -> bool:
    return not text.removesuffix(CURSOR_UP).strip()


def _looks_drawn(text: str) -> bool:
    return _BAR_LOOK.search(text) is not None
