"""A progress bar in the live view: each rank's draws thinned, the last before the
rank's next line kept, and what torchrun's tee makes of its carriage returns left out.
The logs are as two sandbox jobs wrote them (tests/fixtures/torch/README.md)."""

from __future__ import annotations

import re
from pathlib import Path

from gpucluster.launch.bar_draws import CURSOR_UP, BarDraws, Shown
from gpucluster.launch.jobs import JobRecord
from gpucluster.launch.logsearch import timed_lines
from gpucluster.launch.tee_lines import Piece, ranked

FIXTURES = Path(__file__).parents[1] / "fixtures/torch"
DRAW = re.compile(r" *\d+%\|[# ]{10}\| \d+/100")


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def shown_of(log: str, draws: BarDraws) -> Shown:
    shown = [line for text in (FIXTURES / log).read_text().splitlines()
             for piece in ranked(text) for line in draws.take(piece)]
    return shown + draws.rest()


def test_a_bar_shows_its_first_draw_and_the_last_before_each_line() -> None:
    """Rank 0's bar, 100 draws an epoch, a line every 25th; the clock stands still."""
    shown = shown_of("rank0-bar-node1.log", BarDraws(clock=Clock()))
    draws = [text for rank, text in shown if DRAW.fullmatch(text)]
    # each epoch's draws before its 4 lines and its last; the first epoch's first too: a
    # bar is known by its look ("0%|") once the tee read a draw of it open
    assert len(draws) == 11, shown
    for at, (_, text) in enumerate(shown):
        if text in ("checkpoint at 25", "checkpoint at 50", "checkpoint at 75"):
            # the bar as it stood, above it (at 100, the epoch's print on stdout came first)
            assert shown[at - 1][1].endswith(f" {int(text.split()[-1]) - 1}/100"), shown
    assert shown[-1] == ("0", "100%|##########| 100/100")  # the last draw, at the end
    assert not [line for line in shown if not line[1].strip()], shown  # no empty lines


def test_another_ranks_line_glued_to_a_draw_is_that_ranks() -> None:
    """The log has "[0]: 99%|######### | 99/100[1]:rank 1 epoch 0 done"."""
    log = (FIXTURES / "rank0-bar-node1.log").read_text()
    assert "99/100[1]:rank 1 epoch 0 done" in log
    shown = shown_of("rank0-bar-node1.log", BarDraws(clock=Clock()))
    assert ("1", "rank 1 epoch 0 done") in shown
    assert ("0", " 99%|######### | 99/100") in shown
    assert not [text for _, text in shown if "]:" in text], shown


def test_every_draw_shows_once_its_time_is_up() -> None:
    """With no wait between them, each draw shows: none is lost, none shows twice."""
    log = (FIXTURES / "rank0-bar-node1.log").read_text()
    shown = shown_of("rank0-bar-node1.log", BarDraws(every_s=0, clock=Clock()))
    draws = [text for _, text in shown if DRAW.fullmatch(text)]
    assert len(draws) == 2 * 101 == len(re.findall(r"\d+/100", log))
    assert draws[:3] == ["  0%|          | 0/100", "  1%|          | 1/100",
                         "  2%|          | 2/100"]


def test_two_ranks_bars_drawn_at_once_keep_apart() -> None:
    log = (FIXTURES / "two-bars-node2.log").read_text()
    assert "[2]:  1%|          | 1/100[3]:\n" in log  # rank 3's \r, glued to rank 2's draw
    shown = shown_of("two-bars-node2.log", BarDraws(clock=Clock()))
    for rank in ("2", "3"):
        mine = [text for r, text in shown if r == rank]
        assert mine[-1] == "100%|##########| 100/100", mine
        assert f"rank {rank} done" in mine
        assert len([text for text in mine if DRAW.fullmatch(text)]) < 12, mine
    assert len(shown) < 40 < len(log.splitlines()) / 5, shown
    assert not [text for _, text in shown if "]:" in text], shown


def test_a_bar_that_stopped_shows_where_it_stopped() -> None:
    clock = Clock()
    draws = BarDraws(every_s=5, clock=clock)
    assert draws.take(Piece("0", "step 1/9", drawn=True)) == [("0", "step 1/9")]
    assert draws.take(Piece("0", "step 2/9", drawn=True)) == [("0", "step 2/9")]
    assert draws.take(Piece("0", "step 3/9", drawn=True)) == []  # three open: a bar
    clock.now += 1
    assert draws.take(Piece("0", "step 4/9", drawn=True)) == []
    assert draws.due() == []
    clock.now += 4
    assert draws.due() == [("0", "step 4/9")]
    assert draws.due() == []  # shown once
    # moving again after a stop, it shows until it is drawn as often again
    assert draws.take(Piece("0", "step 5/9", drawn=True)) == [("0", "step 5/9")]


def test_empty_lines_of_the_ranks_own_are_shown() -> None:
    draws = BarDraws(clock=Clock())
    pieces = [Piece("0", "a"), Piece("0", ""), Piece("0", ""), Piece("0", "b"),
              Piece("0", "")]
    shown = [line for piece in pieces for line in draws.take(piece)] + draws.rest()
    assert shown == [("0", "a"), ("0", ""), ("0", ""), ("0", "b"), ("0", "")]


def test_torchruns_failure_numbering_stays_in_its_summary() -> None:
    """torchrun numbers each failure "[1]:", as its tee heads a rank's empty line."""
    draws = BarDraws(clock=Clock())
    pieces = [Piece(None, "Failures:"), Piece("1", ""), Piece(None, "  time : 0"),
              Piece(None, "=====")]
    shown = [line for piece in pieces for line in draws.take(piece)] + draws.rest()
    assert shown == [(None, "Failures:"), ("1", ""), (None, "  time : 0"), (None, "=====")]


def test_logs_show_every_draw_and_each_line_under_its_own_rank() -> None:
    """Not followed live (`logs JOB`, searches, --json): every draw, cut as live."""
    texts = (FIXTURES / "rank0-bar-node1.log").read_text().splitlines()
    record = JobRecord("j", "tq0.py", [], ["node1"], "/srv/p", "/srv/p/jobs", 1.0, {"node1": 2})
    lines = list(timed_lines(record, "node1", texts, [0.0] * len(texts)))
    assert len([line for line in lines if DRAW.fullmatch(line.text)]) == 2 * 101
    assert [line.rank for line in lines if line.text == "rank 1 epoch 0 done"] == [1]
    assert not [line for line in lines if "]:" in line.text]
    # The one before the first draw stays: it is passed on as it comes
    assert [at for at, line in enumerate(lines) if not line.text.strip()] == [0]


def test_a_searched_logs_failure_numbering_is_torchruns_not_rank_0s() -> None:
    """`logs --rank 0-1 -n 1` showed `[node4/0] `: the "[0]:" of node4's summary, where
    rank 3 alone ran. A rank's own empty line outside the summary stays its own."""
    texts = ["[3]:", "[3]:boom", "Failures:", "  <NO_OTHER_FAILURES>",
             "Root Cause (first observed failure):", "[0]:", "  rank      : 3", "=" * 20,
             "[3]:"]
    record = JobRecord("j", "f.py", [], ["node4"], "/srv/p", "/srv/p/jobs", 1.0, {"node4": 1})
    lines = [(line.rank, line.text)
             for line in timed_lines(record, "node4", texts, [0.0] * len(texts))]
    assert lines == [(3, ""), (3, "boom"), (None, "Failures:"),
                     (None, "  <NO_OTHER_FAILURES>"),
                     (None, "Root Cause (first observed failure):"), (None, "[0]:"),
                     (None, "  rank      : 3"), (None, "=" * 20), (3, "")]


def test_tqdms_draws_read_whole_are_told_from_its_first() -> None:
    """tqdm's own format: its first draw has "?" for what it does not know yet."""
    draws = BarDraws(clock=Clock())
    first = "epoch 1:   0%|          | 0/500 [00:00<?, ?it/s]"
    assert draws.take(Piece("0", first, drawn=True)) == [("0", first)]
    for n in range(1, 60):  # the tee reads most draws open, every fourth whole
        bar = "▉" * (n // 6)
        assert draws.take(Piece("0", f"epoch 1:  {n // 5:2d}%|{bar:<10}| {n}/500 "
                                     f"[00:{n // 10:02d}<00:49, {9.8 + n / 100:.2f}it/s]",
                                drawn=n % 4 != 0)) == []
    assert draws.take(Piece("0", "loss 0.25")) == [
        ("0", "epoch 1:  11%|▉▉▉▉▉▉▉▉▉ | 59/500 [00:05<00:49, 10.39it/s]"), ("0", "loss 0.25")]


def test_a_print_the_tee_read_in_two_makes_no_bar_of_the_lines_like_it() -> None:
    """print("step", n, "loss", x) is eight writes: the tee may read it half written."""
    clock = Clock()
    draws = BarDraws(clock=clock)
    shown = draws.take(Piece("0", "step 1 loss", drawn=True, ends_later=True))
    shown += draws.take(Piece("0", " 0.5"))
    for n in range(2, 50):
        shown += draws.take(Piece("0", f"step {n} loss 0.{50 - n:02d}"))
        clock.now += 0.5
    shown += draws.take(Piece("0", "step 50 loss 0.01", drawn=True))  # its \n came apart
    for n in range(51, 99):
        shown += draws.take(Piece("0", f"step {n} loss 0.01"))
    shown += draws.rest()
    assert len(shown) == 99 and shown[-1] == ("0", "step 98 loss 0.01"), shown


def test_a_bar_drawn_faster_than_the_tee_reads_is_thinned() -> None:
    """20 draws a second, the tee's reads 10: a draw read whole between open ones."""
    draws = BarDraws(clock=Clock())
    shown = [line for n in range(1, 31)
             for line in draws.take(Piece("0", f"step {n}/30", drawn=n % 2 == 0))]
    assert shown[:3] == [("0", "step 1/30"), ("0", "step 2/30"), ("0", "step 3/30")]
    assert len(shown) < 10 and draws.rest() == [("0", "step 30/30")], shown


def test_a_bar_drawn_at_every_batch_shows_a_few_of_its_draws() -> None:
    """Lightning's bar, a draw a batch (195 a second): the tee read 18-19 draws whole
    between two open ones, after the empty line of the bar's first \r."""
    log = (FIXTURES / "lightning-bar-node1.log").read_text()
    assert log.startswith("[0]:\n[0]:Epoch 0:   0%|") and log.count("it/s") == 2 * 251
    shown = shown_of("lightning-bar-node1.log", BarDraws(clock=Clock()))
    draws = [text for _, text in shown if "it/s" in text]
    assert shown[0] == ("0", draws[0]) and draws[0].startswith("Epoch 0:   0%|")
    # the first draw (read whole: the look of the line after the rank's empty line made
    # it a bar's), the bar as it stood at each epoch's line, and its end
    assert len(draws) == 1 + 2 + 2, shown
    for epoch in (0, 1):
        done = shown.index(("0", f"rank 0 epoch {epoch} done"))
        assert shown[done - 1][1].startswith(f"Epoch {epoch}:  9"), shown
    assert shown[-1] == ("0", draws[-1]) and " 250/250 " in draws[-1]


def _lightning_draw(n: int) -> str:
    return (f"Epoch 0: {n // 6:3d}%|{'█' * (n // 60):<10}| {n}/600 "
            f"[00:{n // 200:02d}<00:{(600 - n) // 200:02d}, 200.00it/s, v_num=0]")


def test_a_bar_drawn_at_every_batch_is_thinned() -> None:
    """Lightning's bar draws once a batch (200 a second), the tee reads 10 times a second:
    20 draws read whole between two open ones. Lines like a print's, the same way, are
    all shown: they make no bar. A bar's draws go on after a pause (an epoch's
    validation) as a bar's."""
    for line, thinned in ((_lightning_draw, True), (lambda n: f"step {n} loss 0.5", False)):
        clock = Clock()
        draws = BarDraws(clock=clock)
        shown = []
        for n in range(1, 1201):
            clock.now += 0.005 if n != 601 else 30
            shown += draws.take(Piece("0", line(n % 600 or 600), drawn=n % 20 == 0))
        shown += draws.rest()
        if thinned:  # the tee's first read (19 read whole before one open), then a few
            assert len(shown) < 30 and shown[-1] == ("0", _lightning_draw(600)), shown
            assert shown[19] == ("0", _lightning_draw(20)), shown
        else:
            assert len(shown) == 1200, len(shown)


def test_a_bar_below_another_is_thinned_as_one() -> None:
    """tqdm's nested bars: the inner one a line down ("\\n\\r" and the draw), then the
    cursor back up (ESC [A) to the outer one; the tee reads an empty line between every
    two of the inner bar's draws."""
    log = (FIXTURES / "nested-bars-node1.log").read_text()
    assert log.count("/40 [") == 2 * 41 and log.count("[0]:\n") > 80
    shown = shown_of("nested-bars-node1.log", BarDraws(clock=Clock()))
    inner = [text for _, text in shown if "/40 [" in text]
    assert len(inner) <= 4 and all(text.endswith(CURSOR_UP) for text in inner), shown
    assert ("0", "rank 0 epoch 0 done") in shown and ("0", "rank 0 epoch 1 done") in shown
    assert shown[-1] == ("0", "100%|##########| 2/2 [00:02<00:00, 1.00it/s]")
    assert not [text for _, text in shown if not text.removesuffix(CURSOR_UP).strip()]


def test_a_plain_line_with_an_arrow_makes_no_bar_by_its_look() -> None:
    """torch's examples print "====> Epoch: 1 Average loss: 164.2" (the VAE's): the tee
    may read one open, and the lines like it must all show."""
    draws = BarDraws(clock=Clock())
    lines = [f"====> Epoch: {n} Average loss: {170 - n}.2" for n in range(1, 4)]
    shown = [*draws.take(Piece("0", lines[0], drawn=True)),
             *(line for text in lines[1:] for line in draws.take(Piece("0", text))),
             *draws.rest()]
    assert shown == [("0", text) for text in lines]
