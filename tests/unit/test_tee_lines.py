"""torchrun's tee: each worker line behind its rank, and what its reading of a line a
rank left open (a progress bar) does to the log. The logs are as a sandbox job wrote
them (tests/fixtures/torch: a bar redrawn three times, then the rank died)."""

from __future__ import annotations

from pathlib import Path

from gpucluster.launch.failure import failure_of
from gpucluster.launch.model import NodeState
from gpucluster.launch.tee_lines import Piece, ranked, split_rank, unglued

DIED_IN_A_BAR = Path(__file__).parents[1] / "fixtures/torch/died-in-a-bar-node2.log"
PRINT_IN_A_BAR = Path(__file__).parents[1] / "fixtures/torch/print-in-a-bar-node1.log"


def test_a_line_is_split_into_its_rank_and_text() -> None:
    assert split_rank("[12]:loss 0.5") == ("12", "loss 0.5")
    assert split_rank("[W1129 socket.cpp:207] note") == (None, "[W1129 socket.cpp:207] note")


def test_a_bars_redraw_loses_the_header_the_tee_glued_to_it() -> None:
    assert split_rank("[3]: 40%|####      | 4/10[3]:") == ("3", " 40%|####      | 4/10")
    assert split_rank("[3]:shape of x[2]:") == ("3", "shape of x[2]:")  # another rank's
    assert split_rank("[3]:") == ("3", "")


def test_a_traceback_glued_to_an_open_line_starts_a_line_of_its_own() -> None:
    traceback = "Traceback (most recent call last):"
    # by the tee, the rank's own header between them
    assert unglued(f"[1]:bar 2/10[1]:{traceback}") == ("[1]:bar 2/10", f"[1]:{traceback}")
    # within the rank's stream (the bar and the error both on stderr): no header between
    assert unglued(f"[1]:bar 2/10{traceback}") == ("[1]:bar 2/10", f"[1]:{traceback}")
    # torch's prefix on each line of a rank's error: a frame too (seen on the sandbox)
    assert unglued("[3]:step 6 loss 0.1[rank3]:     loss = model(batch)") == (
        "[3]:step 6 loss 0.1", "[3]:[rank3]:     loss = model(batch)")
    # another rank's traceback after this rank's open line, torch's own prefix kept
    assert unglued(f"[0]:bar 2/10[1]:[rank1]: {traceback}") == (
        "[0]:bar 2/10", f"[1]:[rank1]: {traceback}")


def test_a_print_while_the_ranks_bar_is_open_is_a_line_of_its_own() -> None:
    """The bar on stderr, the print on stdout, as the sandbox wrote them."""
    lines = PRINT_IN_A_BAR.read_text().splitlines()
    assert lines[3] == "[0]: 16%|##          | 2/12[0]:step 3 loss 0.03"
    shown = [piece.text for line in lines for piece in ranked(line)]
    assert shown[3:6] == [" 16%|##          | 2/12", "step 3 loss 0.03", ""]
    assert shown[-3:] == [" 91%|########### | 11/12", "done", ""]
    assert len(shown) == len(lines) + 4  # the four prints


def test_a_ranks_own_words_with_its_header_in_them_stay_whole() -> None:
    for line in ("[0]:[0]: loss 0.5", "[0]:Epoch [0]: loss 0.5", "[0]:x[0]:"):
        assert unglued(line) == (line,)
    assert unglued("[0]:batch[0]:tensor([1])") == ("[0]:batch", "[0]:tensor([1])")  # alas


def test_torchruns_own_log_line_glued_to_an_open_line_is_torchruns() -> None:
    said = ("W1205 21:22:29.007000 32415 torch/distributed/elastic/agent/server/api.py:753] "
            "Received 15 death signal, shutting down workers")
    assert unglued(f"[0]:bar 2/10{said}") == ("[0]:bar 2/10", said)
    # a worker's own torch warning, the tee's header before it
    assert unglued(f"[0]:bar 2/10[0]:{said}") == ("[0]:bar 2/10", f"[0]:{said}")


def test_a_line_glued_many_times_is_cut_every_time() -> None:
    """A line passed on in pieces (an endless one, 1 MiB at a time) may hold thousands."""
    line = "[3]:" + "step[rank3]: " * 5000
    assert unglued(line) == ("[3]:step", *["[3]:[rank3]: step"] * 4999, "[3]:[rank3]: ")


def test_a_line_without_anything_glued_stays_whole() -> None:
    traceback = "Traceback (most recent call last):"
    said = "W1205 21:22:29.007000 32415 torch/distributed/run.py:803] note"
    for line in (f"[1]:{traceback}", f"[1]:[rank1]: {traceback}", traceback,
                 f"[1]:see the {traceback} above", "[1]:Epoch [1]: loss 0.5",
                 f"torchrun: {traceback}", said, f"[1]:{said}", "[1]:a [list] of words",
                 "[1]:"):
        assert unglued(line) == (line,)


def test_a_failure_in_a_bar_reports_the_ranks_lines_unglued() -> None:
    failure = failure_of("node2", NodeState("node2", "exited", 1, "", 5.0), DIED_IN_A_BAR)
    assert failure.rank == 1 and failure.worker_exit == 1
    assert failure.rank_tail[:5] == ("", "bar 0/10", "bar 1/10", "bar 2/10",
                                     "Traceback (most recent call last):")
    assert failure.rank_error[0] == "Traceback (most recent call last):"
    assert failure.rank_error[-1].startswith("RuntimeError: CUDA out of memory")
    assert failure.cause is not None and "ran out of memory" in failure.cause.what


def test_a_piece_says_whether_the_tee_wrote_it_open() -> None:
    assert ranked("[0]:loss 0.5") == [Piece("0", "loss 0.5")]
    assert ranked("[0]:bar 2/9[0]:") == [Piece("0", "bar 2/9", drawn=True)]
    # the rank's print came before the \r that ends the draw: an empty line of it later
    assert ranked("[0]:bar 2/9[0]:done") == [Piece("0", "bar 2/9", True, True),
                                              Piece("0", "done")]


def test_another_ranks_header_ending_a_line_is_its_empty_line() -> None:
    """Two ranks' bars at once: the \\r ending rank 3's draw glued to rank 2's draw."""
    assert unglued("[2]: 1%| 1/100[3]:") == ("[2]: 1%| 1/100", "[3]:")
    assert ranked("[2]: 1%| 1/100[3]:")[1] == Piece("3", "")
    for words in ("[2]:Epoch [3]:", "[2]:[3]:"):  # behind a space, or all the text
        assert unglued(words) == (words,)


def test_a_line_taken_for_plain_is_one_nothing_would_cut() -> None:
    """ranked() skips unglued() for a line with nothing to cut: a tqdm draw has a "]" of
    its own ("[00:05<00:06, 90.00it/s]"), and taking every one for glued cost 9 us a
    line (Lightning's bar, a draw a batch: 600000 lines of a log in 6 s)."""
    from gpucluster.launch.tee_lines import _plain, _split

    lines = [line for log in sorted(DIED_IN_A_BAR.parent.glob("*.log"))
             for line in log.read_text().splitlines()]
    plain = [line for line in lines if _plain(line)]
    assert len(lines) > 1000 and len(plain) > len(lines) / 2
    assert all(unglued(line) == (line,) and not _split(line)[2] for line in plain)
    assert _plain("[0]:Epoch 0:  93%|█▎| 234/250 [00:01<00:00, 194.75it/s, loss=0.00426]  ")
    for glued in ("[0]: 4/10[0]:", "[0]:x[3]:", "[0]:x[rank0]: y",
                  "[0]:bar 2/10W1205 21:22:29.007000 32415 api.py:753] Received 15"):
        assert not _plain(glued), glued
        assert unglued(glued) != (glued,) or _split(glued)[2], glued
