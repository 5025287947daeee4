"""Output: clush-style folding, the failure summary, and the pinned JSON schemas."""

from __future__ import annotations

import io
import json
import re
import time
from pathlib import Path

from rich.console import Console

from gpucluster import inventory
from gpucluster.cli.views import common, run
from gpucluster.cli.views import inventory as inventory_view
from gpucluster.cli.views.line_printer import LinePrinter
from gpucluster.remote.result import CommandResult, FailureKind, FanoutResult, HostFailure

ROOT = Path(__file__).resolve().parents[2]


def _result() -> FanoutResult[CommandResult]:
    def ok(host: str, out: str, code: int = 0) -> CommandResult:
        return CommandResult(host, "cmd", code, out, "", 0.1234)
    return FanoutResult(
        hosts=("n1", "n2", "n3", "n4", "n5"),
        values={"n1": ok("n1", "same\n"), "n2": ok("n2", "same\n"), "n3": ok("n3", "odd\n"),
                "n4": ok("n4", "", 2)},
        failures={"n5": HostFailure("n5", FailureKind.UNREACHABLE, "no answer")},
    )


def _text(draw, width: int = 120) -> str:
    buffer = io.StringIO()
    draw(Console(file=buffer, width=width, no_color=True, highlight=False))
    return buffer.getvalue()


def test_identical_outputs_fold_and_unique_ones_are_prefixed() -> None:
    text = _text(lambda console: run.print_run(console, _result()))
    assert "n[1-2] (2)\n---------------\nsame\n" in text
    assert "n3: odd\n" in text
    assert "n4: exited with exit code 2\n" in text
    assert "n5: unreachable: no answer\n" in text


def test_outputs_are_written_as_the_hosts_sent_them() -> None:
    """A pdsh-like tool's output is piped on: tabs stay tabs, long lines stay whole,
    text that looks like markup or holds escapes is not interpreted."""
    body = "a\tb\n" + "x" * 300 + "\n[bold]not markup[/]\n\x1b[31mred\x1b[0m\n"

    def result(hosts: tuple[str, ...]) -> FanoutResult[CommandResult]:
        return FanoutResult(hosts=hosts, values={
            h: CommandResult(h, "cmd", 0, body, "", 0.1) for h in hosts})

    folded = _text(lambda console: run.print_run(console, result(("n1", "n2"))))
    assert folded.endswith("---------------\n" + body), folded
    prefixed = _text(lambda console: run.print_run(console, result(("n1",))))
    assert prefixed == "".join(f"n1: {line}\n" for line in body.splitlines())


def test_hosts_that_failed_alike_are_said_once() -> None:
    """A typo in identity_file fails all 64 nodes alike: one line, not 64."""
    hosts = ("n1", "n2", "n3", "n4")
    failures = {h: HostFailure(h, FailureKind.AUTH_FAILED, "identity file /k does not exist")
                for h in hosts[:3]}
    failures["n4"] = HostFailure("n4", FailureKind.UNREACHABLE, "no answer")
    result: FanoutResult[CommandResult] = FanoutResult(hosts=hosts, values={},
                                                       failures=failures)
    assert _text(lambda console: run.print_run(console, result)) == (
        "n[1-3]: auth failed: identity file /k does not exist\nn4: unreachable: no answer\n")
    assert run.failure_summary(result) == \
        "4 of 4 hosts failed: n[1-3] (auth failed), n4 (unreachable)"


def test_a_command_ended_by_a_signal_says_so_not_exit_minus_one() -> None:
    """sshd sends exit-signal, not exit-status, for a command a signal ended; paramiko
    then reports -1, which read as `exit -1`."""
    killed = FanoutResult(hosts=("n1", "n2", "n3"), values={
        "n1": CommandResult("n1", "c", -1, "", "", 0.1),
        "n2": CommandResult("n2", "c", 0, "", "", 0.1),
        "n3": CommandResult("n3", "c", -1, "", "", 0.1, signal="KILL")})
    assert run.failure_summary(killed) == ("2 of 3 hosts failed: n1 (killed by a signal), "
                                           "n3 (killed by SIGKILL)")
    shown = _text(lambda console: run.print_run(console, killed))
    assert "n1: killed by a signal (no exit code)\n" in shown
    assert "n3: killed by SIGKILL (no exit code)\n" in shown
    assert run.run_payload("c", killed)["hosts"][2]["signal"] == "KILL"


def test_failure_summary_is_one_line_naming_hosts_and_reasons() -> None:
    assert run.failure_summary(_result()) == \
        "2 of 5 hosts failed: n4 (exit 2), n5 (unreachable)"
    all_ok = FanoutResult(hosts=("a",), values={"a": CommandResult("a", "c", 0, "", "", 0)})
    assert run.failure_summary(all_ok) is None


def test_sudo_asking_a_password_names_ask_sudo_pass_only_where_sudo_n_refused() -> None:
    refused = "sudo: a password is required\n"
    result = FanoutResult(hosts=("n1", "n2", "n3", "n4"), values={
        "n1": CommandResult("n1", "c", 1, "", refused, 0.1),
        "n2": CommandResult("n2", "c", 1, "", refused, 0.1),
        # The command's own output before its own sudo: our sudo -n let it run.
        "n3": CommandResult("n3", "c", 1, "", "root\n" + refused, 0.1),
        "n4": CommandResult("n4", "c", 0, "", "", 0.1)})
    assert run.sudo_password_fix(result) == \
        " (fix: sudo asks a password on n[1-2]: add --ask-sudo-pass)"
    assert run.sudo_password_fix(_result()) == ""


def test_job_lines_into_a_full_disk_stop_there_and_say_so_once(tmp_path: Path) -> None:
    """`launch ... > run.log` on a full disk: the printer's OSError ended the node's
    follower, and the node was taken for lost (--recover relaunched a healthy job)."""

    notes = io.StringIO()
    with Path("/dev/full").open("w") as full:  # every write: ENOSPC
        printer = LinePrinter(full, notes)
        for number in range(3):
            printer("node1", "0", f"epoch {number}")  # no error reaches the follower
    assert notes.getvalue() == ("gpucluster: /dev/full: No space left on device: the job's "
                                "lines are no longer written there; the job goes on "
                                "(gpucluster logs shows them)\n")


def test_a_cpp_backtrace_is_one_line_per_node_in_the_live_view() -> None:
    """torch's teardown warning at the end of a multi-node job (the head's agent took the
    rendezvous store with it) printed 15 frames per node, interleaved: the live view
    says where the error was raised and how many frames it left out, each node apart."""

    out = io.StringIO()
    printer = LinePrinter(out, full_logs="gpucluster logs J")
    printer("node2", None, "[W1204 TCPStore.cpp:115] [c10d] recvVector failed")
    printer("node2", None, "Exception raised from recvBytes at Utils.hpp:787 (most recent "
                           "call first):")
    printer("node3", "1", "Exception raised from recv at Utils.hpp:9 (most recent call first):")
    for number in range(3):
        printer("node2", None, f"frame #{number}: c10::Error::Error + 0x9d")
        printer("node3", "1", f"frame #{number}: <unknown function> + 0x3d2825")
        printer("node1", "0", f"frame #{number}: decoded")  # a script's own, no backtrace
    printer("node2", None, "<omitting python frames>")
    printer("node2", None, "frame #27: _start + 0x21")
    printer("node2", None, "The node has failed to shutdown the rendezvous")
    printer("node2", None, "frame #4: after the backtrace: the script's own")
    assert out.getvalue().splitlines() == [
        "[node2] [W1204 TCPStore.cpp:115] [c10d] recvVector failed",
        "[node2] Exception raised from recvBytes at Utils.hpp:787 (most recent call first):",
        "[node3/1] Exception raised from recv at Utils.hpp:9 (most recent call first):",
        *(f"[node1/0] frame #{number}: decoded" for number in range(3)),
        "[node2] (5 lines of C++ backtrace left out: gpucluster logs J prints them)",
        "[node2] The node has failed to shutdown the rendezvous",
        "[node2] frame #4: after the backtrace: the script's own"]
    printer.finish()  # node3's output ended inside its backtrace
    assert out.getvalue().splitlines()[-1] == \
        "[node3/1] (3 lines of C++ backtrace left out: gpucluster logs J prints them)"
    printer.finish()
    assert len(out.getvalue().splitlines()) == 10
    # Not live (`logs JOB`), every line as it came.
    whole = io.StringIO()
    printer = LinePrinter(whole)
    printer("node2", None, "Exception raised from recv at Utils.hpp:9 (most recent call first):")
    printer("node2", None, "frame #0: c10::Error::Error + 0x9d")
    assert whole.getvalue().splitlines()[-1] == "[node2] frame #0: c10::Error::Error + 0x9d"


def test_torchruns_own_tracebacks_are_folded_live_and_a_ranks_is_not() -> None:
    """The real thing: rank 1 died in a progress bar on node2, launch then stopped node1;
    each node's torchrun printed its own traceback (26 lines of frames on node1, of the
    SIGTERM it was sent), which buried the rank's in the live view."""
    from gpucluster.launch.tee_lines import ranked

    fixtures = Path(__file__).parents[1] / "fixtures/torch"
    out = io.StringIO()
    printer = LinePrinter(out, full_logs="gpucluster logs J")
    for node, name in (("node2", "died-in-a-bar-node2.log"),
                       ("node1", "stopped-in-a-bar-node1.log")):
        for line in (fixtures / name).read_text().splitlines():
            for rank, text, _, _ in ranked(line):
                printer(node, rank, text)
    printer.finish()
    shown = out.getvalue().splitlines()
    at = shown.index("[node2/1] bar 2/10")
    assert shown[at + 1:at + 5] == [  # the rank's own traceback, whole
        "[node2/1] Traceback (most recent call last):",
        '[node2/1]   File "/srv/gpucluster/proj/barfail.py", line 8, in <module>',
        '[node2/1]     raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB")',
        "[node2/1] RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB"]
    at = shown.index("[node2] Traceback (most recent call last):")
    assert shown[at + 1:at + 4] == [
        "[node2] (15 lines of torchrun's own traceback left out: gpucluster logs J prints "
        "them)",
        "[node2] torch.distributed.elastic.multiprocessing.errors.ChildFailedError: ",
        "[node2] ============================================================"]
    at = shown.index("[node2] Root Cause (first observed failure):")
    assert shown[at + 1:at + 3] == ["[node2] [0]:", "[node2]   time      : 2026-12-05_21:23:47"]
    assert "[node2/0] " not in shown  # its numbering, not an empty line of rank 0
    assert shown[-6:] == [
        "[node1/0] bar 2/10",
        "[node1] W1205 21:23:48.174000 2373 torch/distributed/elastic/agent/server/api.py"
        ":753] Received 15 death signal, shutting down workers",
        "[node1] W1205 21:23:48.175000 2373 torch/distributed/elastic/multiprocessing/api.py"
        ":1028] Sending process 2838 closing signal SIGTERM",
        "[node1] Traceback (most recent call last):",
        "[node1] (26 lines of torchrun's own traceback left out: gpucluster logs J prints "
        "them)",
        "[node1] torch.distributed.elastic.multiprocessing.api.SignalException: Process "
        "2373 got signal: 15"]
    assert len(shown) == 36


def test_a_folded_traceback_names_the_job_of_the_attempt_it_came_from() -> None:
    """Under --recover each attempt is a job of its own; the note on a fold says the job
    whose log has the frames, though it is written after the next attempt began."""
    out = io.StringIO()
    printer = LinePrinter(out, full_logs="gpucluster logs attempt-1")
    printer("node1", None, "Traceback (most recent call last):")
    printer("node1", None, '  File "torchrun", line 8, in <module>')
    printer("node2", None, "Traceback (most recent call last):")
    printer("node2", None, '  File "torchrun", line 8, in <module>')
    printer("node1", None, "SignalException: Process 3865 got signal: 15")
    printer.full_logs = "gpucluster logs attempt-2"
    printer("node2", None, "rank 2/4 on node2 ready")  # node2's fold ends here
    printer("node2", None, "Traceback (most recent call last):")
    printer("node2", None, '  File "torchrun", line 9, in <module>')
    printer.finish()
    notes = [line for line in out.getvalue().splitlines() if "left out" in line]
    assert notes == [
        "[node1] (1 line of torchrun's own traceback left out: gpucluster logs attempt-1 "
        "prints them)",
        "[node2] (1 line of torchrun's own traceback left out: gpucluster logs attempt-1 "
        "prints them)",
        "[node2] (1 line of torchrun's own traceback left out: gpucluster logs attempt-2 "
        "prints them)"]


def test_not_live_lines_are_written_a_batch_at_a_time_and_the_rest_at_finish() -> None:
    """`logs JOB` wrote each line apart: 600000 writes, 1.4 s of its 3.6."""
    from gpucluster.cli.views import line_printer

    class Counted(io.StringIO):
        writes = 0

        def write(self, text: str) -> int:
            self.writes += 1
            return super().write(text)

    out = Counted()
    printer = LinePrinter(out, live=False)
    lines = line_printer.BATCH_LINES * 2 + 10
    for step in range(lines):
        printer(f"node{step % 2}", "0", f"step {step}")
    assert printer.heard == {"node0", "node1"}  # at once, not when written
    assert out.getvalue().count("\n") == line_printer.BATCH_LINES * 2 and out.writes == 2
    printer.finish()
    assert out.getvalue().splitlines() == [f"[node{step % 2}/0] step {step}"
                                           for step in range(lines)]
    printer.finish()
    assert out.writes == 3


def test_lines_from_many_threads_are_each_written_once_whole_and_in_their_order() -> None:
    """Whichever thread holds the printer writes the lines the others left: none may be
    left behind when the threads are done (before finish), none written twice."""
    import threading


    class Slow(io.StringIO):  # writes that let go of the GIL, as a terminal's do
        def flush(self) -> None:
            time.sleep(0.0002)

    out = Slow()
    printer = LinePrinter(out)
    nodes = [f"node{n}" for n in range(8)]

    def send(node: str) -> None:
        for step in range(3000):
            printer(node, "0", f"step {step}")

    threads = [threading.Thread(target=send, args=(node,)) for node in nodes]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    written = out.getvalue().splitlines()
    assert len(written) == 8 * 3000
    for node in nodes:
        assert [line for line in written if line.startswith(f"[{node}/")] == \
            [f"[{node}/0] step {step}" for step in range(3000)]

    # The race that matters, made certain: a line comes while its writer flushes. Its
    # thread cannot take the printer and goes on; the writer writes it before it returns.
    class Interrupted(io.StringIO):
        def flush(self) -> None:
            if not self.getvalue().count("node2"):
                other = threading.Thread(target=printer, args=("node2", "1", "meanwhile"))
                other.start()
                other.join()

    out = Interrupted()
    printer = LinePrinter(out)
    printer("node1", "0", "first")
    assert out.getvalue().splitlines() == ["[node1/0] first", "[node2/1] meanwhile"]


def test_torchs_teardown_warning_as_a_sandbox_node_printed_it_is_five_lines_live() -> None:
    """The real thing: node2's end of a demo job that exited 0 (torch 2.13)."""

    captured = Path(__file__).parents[1] / "fixtures/torch/teardown-race-node2.log"
    out = io.StringIO()
    printer = LinePrinter(out, full_logs="gpucluster logs J")
    for text in captured.read_text().splitlines():
        printer("node2", None, text)
    printer.finish()
    shown = out.getvalue().splitlines()
    assert len(shown) == 5 and shown[3] == "[node2] "
    assert shown[1].startswith("[node2] Exception raised from recvBytes at ")
    assert shown[2] == "[node2] (12 lines of C++ backtrace left out: gpucluster logs J " \
                       "prints them)"
    assert "has failed to shutdown the rendezvous" in shown[4]


def test_the_teardown_warning_after_a_clean_end_is_named_in_the_outcome(tmp_path: Path
                                                                         ) -> None:
    """The same capture on node2 and node3: where the job then exited 0, the outcome says
    it is torch's race; where it failed, the warning may be the failure's: nothing said."""
    from gpucluster.cli.views import launch as launch_view
    from gpucluster.launch.jobs import JobRecord, JobStore
    from gpucluster.launch.model import JobOutcome, NodeState

    captured = Path(__file__).parents[1] / "fixtures/torch/teardown-race-node2.log"
    printer = LinePrinter(io.StringIO(), full_logs="gpucluster logs J")
    for node in ("node2", "node3"):
        for text in captured.read_text().splitlines():
            printer(node, None, text)
    printer("node1", "0", "The node 'x' has failed to shutdown the rendezvous 'y' (a rank's)")
    record = JobRecord("20261130-120000-abcd", "t.py", [], ["node1", "node2", "node3"],
                       "/c", "/j", 0.0, {"node1": 1, "node2": 1, "node3": 1})
    store = JobStore(tmp_path)

    def outcome(node3_exit: int) -> str:
        states = {"node1": NodeState("node1", "exited", 0),
                  "node2": NodeState("node2", "exited", 0),
                  "node3": NodeState("node3", "exited", node3_exit)}
        return _text(lambda console: launch_view.print_outcome(
            console, JobOutcome(record, states), store, printer.rendezvous_not_closed),
            width=300)

    assert 'node[2-3]: torch\'s "failed to shutdown the rendezvous" came after the job ' \
           "exited 0 there: torch's teardown race" in outcome(0)
    assert "node2: torch's" in outcome(1) and "node[2-3]" not in outcome(1)
    quiet = LinePrinter(io.StringIO())
    quiet("node2", None, "epoch 1 loss 0.5")
    assert "teardown race" not in _text(lambda console: launch_view.print_outcome(
        console, JobOutcome(record, {"node2": NodeState("node2", "exited", 0)}), store,
        quiet.rendezvous_not_closed))


def test_run_json_schema_is_pinned() -> None:
    payload = json.loads(_text(lambda c: common.print_json(
        c, run.run_payload("cmd", _result()))))
    assert payload["schema"] == 1
    assert set(payload) == {"schema", "command", "hosts", "failed"}
    assert payload["failed"] == ["n4", "n5"]
    assert payload["hosts"][0] == {"host": "n1", "ok": True, "exit_code": 0, "stdout": "same\n",
                                   "stderr": "", "duration_s": 0.123, "signal": None,
                                   "error": None}
    assert payload["hosts"][4]["error"] == {"kind": "unreachable", "message": "no answer",
                                         "output": ""}
    assert payload["hosts"][4]["exit_code"] is None


def test_inventory_json_schema_is_pinned() -> None:
    loaded = inventory.load(ROOT / "inventory.example.yaml")
    payload = json.loads(_text(
        lambda c: common.print_json(c, inventory_view.hosts_payload(loaded))))
    assert set(payload) == {"schema", "inventory", "cluster", "groups", "hosts"}
    assert set(payload["hosts"][0]) == {"name", "address", "user", "port", "identity_file",
                                        "jump_host", "connection", "gpus", "gpu_model",
                                        "torch_device", "spare", "labels", "groups"}
    assert payload["hosts"][0]["name"] == "gpu01"
    assert [h["name"] for h in payload["hosts"] if h["spare"]] == ["gpu06"]
    # The table says which host is the spare, and cuts no label (the example's gpu05
    # has two: at 80 columns they wrap where a space lets them)
    shown = _text(lambda c: inventory_view.print_hosts(c, loaded), width=80)
    assert re.search(r"│ gpu06 .*│ spare │", shown), shown
    assert "role=eval" in shown and "…" not in shown, shown
    assert payload["groups"]["train"] == ["gpu01", "gpu02", "gpu03", "gpu04"]


def test_provision_says_what_nodes_share_once_for_all_of_them() -> None:
    from gpucluster.cli.views.provision import print_report
    from gpucluster.provision.model import Change, NodeResult, Outcome
    from gpucluster.provision.runner import ProvisionReport

    config = Change("write ~/.ssh/config", "+Host node1\n")
    results = tuple(
        [NodeResult("ssh-mesh", f"n{i}", Outcome.PLANNED, (config,)) for i in (1, 2, 3)]
        + [NodeResult("hosts", f"n{i}", Outcome.PLANNED, (Change("write /etc/hosts",
                                                                 f"+10.0.0.{i}\tn{i}\n"),))
           for i in (1, 2)]
        + [NodeResult("image", f"n{i}", Outcome.SKIPPED, message="no `image:`")
           for i in (1, 2, 3)]
        + [NodeResult("firewall", "n3", Outcome.FAILED, message="iptables: not found")])
    text = _text(lambda console: print_report(console, ProvisionReport(
        ("n1", "n2", "n3"), ("ssh-mesh", "hosts", "firewall", "image"), results), True))
    lines = text.splitlines()
    assert lines.count("n[1-3] ssh-mesh: write ~/.ssh/config") == 1
    assert text.count("+Host node1") == 1
    # Changes that differ stay apart, each with its own diff
    assert "n1 hosts: write /etc/hosts" in lines and "n2 hosts: write /etc/hosts" in lines
    assert "n[1-3] image: no `image:`" in lines and "n3 firewall: iptables: not found" in lines
    assert lines[-1].startswith("provision: 5 node-steps would change in 0.0 s;")


def test_a_one_node_cluster_is_counted_in_the_singular_and_has_no_ssh_matrix() -> None:
    from gpucluster.cli.views.provision import print_report
    from gpucluster.provision.model import NodeResult, Outcome
    from gpucluster.provision.runner import ProvisionReport

    report = ProvisionReport(("n1",), ("ssh-mesh",), (
        NodeResult("ssh-mesh", "n1", Outcome.CHANGED),), verified={"ssh-mesh": {"n1": {}}},
        duration_s=2.46, phases={"parity": 1.9, "ssh-mesh": 0.51, "image": 0.01})
    text = _text(lambda console: print_report(console, report, False))
    assert "SSH from" not in text and "pairs" not in text
    # where the time went, without the steps that took none
    assert text.splitlines()[-1].startswith(
        "provision: 1 node-step changed in 2.5 s (parity 1.9 s, ssh-mesh 0.5 s);")
    assert run.failure_summary(FanoutResult(hosts=("n1",), values={}, failures={
        "n1": HostFailure("n1", FailureKind.UNREACHABLE, "no answer")})).startswith(
        "1 of 1 host failed")


def test_counts_are_worded_in_the_singular_for_one() -> None:
    from gpucluster.wording import counted

    assert [counted(n, "node") for n in (0, 1, 2)] == ["0 nodes", "1 node", "2 nodes"]
    assert counted(1, "process", "processes") == "1 process"
    assert counted(3, "process", "processes") == "3 processes"


def test_a_one_rank_smoke_says_it_measured_no_link() -> None:
    from gpucluster.cli.views.smoke import print_smoke
    from gpucluster.smoke.runner import SmokeReport

    sweep = [{"bytes": 65536, "time_s": 3e-5, "algbw_gbps": 18.7, "busbw_gbps": 0.0,
              "correct": True}]
    alone = _text(lambda console: print_smoke(console, SmokeReport("gloo", 1, sweep, {}, {},
                                                                   [])))
    assert "all-reduce, 1 rank, backend gloo" in alone and "crossed no link" in alone
    two = _text(lambda console: print_smoke(console, SmokeReport("gloo", 2, sweep, {}, {},
                                                                 [])))
    assert "2 ranks" in two and "crossed no link" not in two and "on GPU" not in two
    some = _text(lambda console: print_smoke(console, SmokeReport("nccl", 2, sweep, {}, {},
                                                                  [], gpus="2,3")))
    assert "all-reduce, 2 ranks, backend nccl, on GPU 2,3" in some


def test_an_outcome_without_any_nodes_state_says_so(tmp_path: Path) -> None:
    from gpucluster.cli.views.launch import print_outcome
    from gpucluster.launch.jobs import JobRecord, JobStore
    from gpucluster.launch.model import JobOutcome, NodeState

    record = JobRecord("20261130-120000-abcd", "t.py", [], ["n1", "n2"], "/c", "/j", 0.0,
                       {"n1": 1, "n2": 1})
    store = JobStore(tmp_path)
    none = _text(lambda console: print_outcome(console, JobOutcome(record), store))
    assert none.startswith(f"job {record.id}: no node sent its state (gpucluster jobs asks "
                           f"again); logs in "), none  # not "job ...: ; logs in"
    both = JobOutcome(record, {"n1": NodeState("n1", "exited", 0),
                               "n2": NodeState("n2", "exited", 0)})
    assert _text(lambda console: print_outcome(console, both, store)).startswith(
        f"job {record.id}: exited 0 on n[1-2]; logs in ")
    assert "--debug" not in _text(lambda console: print_outcome(console, both, store))


def test_a_debug_jobs_outcome_says_where_its_files_are_and_what_collects_them(
        tmp_path: Path) -> None:
    """NCCL_DEBUG_FILE and the flight recorder write on the nodes, not into the log."""
    from gpucluster.cli.views.launch import print_outcome
    from gpucluster.launch.jobs import JobRecord, JobStore
    from gpucluster.launch.model import JobOutcome, NodeState

    record = JobRecord("20261130-120000-abcd", "t.py", [], ["n1"], "/c", "/w/jobs", 0.0,
                       {"n1": 1}, debug=True)
    shown = _text(lambda console: print_outcome(
        console, JobOutcome(record, {"n1": NodeState("n1", "exited", 1)}),
        JobStore(tmp_path)), width=300)
    assert f"/w/jobs/{record.id}/NODE/nccl/ and /w/jobs/{record.id}/NODE/flight-recorder/ " \
        f"on each node" in shown
    assert f"gpucluster bundle {record.id} collects them" in shown
    from gpucluster.launch.node_scripts import DEBUG_DIRS
    written = (Path(__file__).parents[2] / "templates/launch/_debug_env.sh.j2").read_text()
    assert all(f'"$GPC_JOB_DIR/{name}"' in written for name in DEBUG_DIRS)


def test_inventory_show_says_once_what_every_host_shares(tmp_path: Path) -> None:
    """At 80 columns the example's 8 hosts took 4 lines each (the GPU model wrapped in
    every row): what all hosts share is one line above a table of what differs."""
    path = tmp_path / "inv.yaml"
    path.write_text("defaults: {user: ubuntu, gpus: 8, gpu_model: NVIDIA H100 80GB HBM3, "
                    "labels: {site: dc1}}\nhosts:\n  - name: gpu[01-03]\n"
                    "    address: 10.0.0.[11-13]\n  - {name: gpu04, address: 10.0.0.14, "
                    "groups: [eval]}\n")
    text = _text(lambda console: inventory_view.print_hosts(console, inventory.load(path)))
    assert ("every host: user ubuntu, port 22, gpus 8, model NVIDIA H100 80GB HBM3, "
            "labels site=dc1\n") in text
    rows = [line for line in text.splitlines() if line.startswith("│ gpu0")]
    assert len(rows) == 4, text  # one line per host
    assert "eval" in rows[3] and "ubuntu" not in rows[0]
    one = tmp_path / "one.yaml"
    one.write_text("hosts:\n  - {name: solo, address: 10.0.0.1, user: me}\n")
    single = _text(lambda console: inventory_view.print_hosts(console, inventory.load(one)))
    assert "every host" not in single and "me" in single  # one host: a plain table


def test_the_doctor_table_folds_nodes_that_agree_so_16_fit_in_80_columns() -> None:
    """At 80 columns 16 node columns were cut to `n…` and `…`: node7's FAIL was not
    there to see. Nodes with the same status for every check share one column; when the
    columns still do not fit, each check is a line of statuses and their nodes."""
    from gpucluster.cli.views import doctor as doctor_view
    from gpucluster.doctor.model import CheckResult, Status
    from gpucluster.doctor.runner import DoctorReport

    hosts = tuple(f"node{i}" for i in range(1, 17))
    checks = ("ssh", "driver", "name-resolution")

    def report(failing: set[str]) -> DoctorReport:
        return DoctorReport(hosts, checks, tuple(
            CheckResult(c, h, Status.FAIL if c == "driver" and h in failing else Status.OK,
                        "m") for c in checks for h in hosts))

    text = _text(lambda console: doctor_view.print_report(console, report({"node7"}), False))
    header = next(line for line in text.splitlines() if "check" in line)
    assert "node[1-6,8-16]" in header and "node7" in header
    assert max(len(line) for line in text.splitlines()) <= 120
    driver = next(line for line in text.splitlines() if line.startswith("│ driver"))
    assert "OK" in driver and "FAIL" in driver
    narrow = io.StringIO()
    every = tuple(f"check{i}" for i in range(1, 17))  # node N fails checkN: 16 columns
    apart = DoctorReport(hosts, every, tuple(
        CheckResult(c, h, Status.FAIL if c[5:] == h[4:] else Status.OK, "m")
        for c in every for h in hosts))
    doctor_view.print_report(Console(file=narrow, width=80, no_color=True), apart, False)
    lines = narrow.getvalue().splitlines()
    assert all(len(line) <= 80 for line in lines) and "…" not in narrow.getvalue()
    assert " check7   FAIL node7  OK node[1-6,8-16]" in lines


def test_provision_on_16_nodes_folds_its_rows_and_says_a_whole_mesh_in_a_line() -> None:
    """16 rows of the same outcomes, and a 16 x 16 SSH matrix cut at 80 columns: nodes
    with the same outcomes share a row, a mesh where every pair logs in is one line, and
    a broken one that does not fit is said as its failing pairs."""
    from gpucluster.cli.views.provision import print_report
    from gpucluster.provision.model import NodeResult, Outcome
    from gpucluster.provision.runner import ProvisionReport

    hosts = tuple(f"node{i}" for i in range(1, 17))
    results = tuple(NodeResult(step, h, Outcome.FAILED if (step, h) == ("hosts", "node7")
                               else Outcome.CHANGED)
                    for step in ("ssh-mesh", "hosts") for h in hosts)
    mesh = {h: {p: "ok" for p in hosts if p != h} for h in hosts}
    narrow = io.StringIO()
    print_report(Console(file=narrow, width=80, no_color=True),
                 ProvisionReport(hosts, ("ssh-mesh", "hosts"), results,
                                 verified={"ssh-mesh": mesh}), False)
    text = narrow.getvalue()
    assert "…" not in text and all(len(line) <= 80 for line in text.splitlines())
    rows = [line for line in text.splitlines() if line.startswith("│ node")]
    assert len(rows) == 2 and "node[1-6,8-16]" in rows[0] and "node7" in rows[1]
    assert "ssh-mesh: every node logs in to every other (240 pairs)" in text
    mesh["node3"]["node9"] = "refused"
    broken = io.StringIO()
    print_report(Console(file=broken, width=80, no_color=True),
                 ProvisionReport(hosts, ("ssh-mesh", "hosts"), results,
                                 verified={"ssh-mesh": mesh}), False)
    assert "…" not in broken.getvalue()
    assert "ssh-mesh: 1 pair cannot log in: node3 -> node9" in broken.getvalue()


def test_phase_times_end_each_phase_where_the_next_begins() -> None:
    import time

    from gpucluster.phases import PhaseTimes

    seen: list[str] = []
    phases = PhaseTimes(seen.append)
    assert phases.durations() == {}
    phases("parity")
    time.sleep(0.05)
    phases("ssh-mesh")
    durations = phases.durations()
    assert seen == ["parity", "ssh-mesh"] and list(durations) == ["parity", "ssh-mesh"]
    assert durations["parity"] >= 0.05 and durations["ssh-mesh"] >= 0


def test_every_provision_step_says_what_it_does_as_it_begins() -> None:
    from gpucluster.cli.views.provision import phase_line
    from gpucluster.provision.runner import STEP_NAMES

    lines = [phase_line(step) for step in STEP_NAMES]  # a new step without words: KeyError
    assert lines[0].startswith("parity: ") and "torch" in lines[0]
    assert "hosts: /etc/hosts block: every node's name -> its cluster address" in lines


def test_the_jobs_table_keeps_each_state_on_its_jobs_line_in_80_columns() -> None:
    """A column of full start dates (the id's own date and time again) left the state
    18 columns in an 80-column terminal: `running:` over `node[1-2]`, and a failure in
    seven lines. The start is now an age."""
    from gpucluster.cli.views.launch import print_jobs
    from gpucluster.launch.jobs import JobRecord
    from gpucluster.launch.model import NodeState

    started = time.time() - 300
    record = JobRecord(time.strftime("%Y%m%d-%H%M%S-f511", time.localtime(started)),
                       "train.py", ["--epochs", "400", "--step-delay", "0.05"],
                       ["node1", "node2"], "/w/proj", "/w/jobs", started,
                       {"node1": 1, "node2": 1})
    states = {record.id: {n: NodeState(n, "running") for n in record.hosts}}
    text = _text(lambda console: print_jobs(console, [record], states, {}, {}), width=80)
    line = next(line for line in text.splitlines() if record.id in line)
    assert re.search(r"\b5m ago .*running: node\[1-2\]", line), text


def test_a_table_keeps_long_words_whole_where_they_fit_and_never_crops_them() -> None:
    run_id = "20261206-061848-cd8a"
    row = ("20261206-061927-3054", "train.py --epochs 10 --step-delay 0.05",
           "1h ago", f"exited 0: node[1-2]; attempt 2 of run {run_id}")
    text = _text(lambda console: common.print_table(console, "jobs", ("job", "command",
                                                                      "started", "state"),
                                                    [row]), width=80)
    assert run_id in text, text  # rich had folded it over two lines (`-cd8` and `a`)
    # Words wider than the terminal leaves room for fold, rather than cropping the table.
    word = "x" * 30
    text = _text(lambda console: common.print_table(console, "t", ("a", "b", "c"),
                                                    [("key", word, word)]), width=50)
    assert max(len(line) for line in text.splitlines()) <= 50
    assert text.count("x") == 60, text


def test_an_aborted_ranks_stack_is_one_line_in_the_live_view() -> None:
    """A hang's stop aborts every rank, and each writes faulthandler's dump of its
    stacks: ten lines per rank, 640 on 64 ranks. The summary after it says where each
    rank was; live, each dump is its first line and one that says what was left out."""
    from gpucluster.launch.tee_lines import split_rank

    captured = Path(__file__).parents[1] / "fixtures/torch/hang-stacks/node1.log"
    out = io.StringIO()
    printer = LinePrinter(out, full_logs="gpucluster logs J")
    for line in captured.read_text().splitlines():
        printer("node1", *split_rank(line))
    printer.finish()
    shown = out.getvalue().splitlines()
    for rank in ("0", "1"):
        at = shown.index(f"[node1/{rank}] Fatal Python error: Aborted")
        assert shown[at + 1] == f"[node1/{rank}] (9 lines of its Python stack left out: " \
                                f"gpucluster logs J prints them)", shown[at:at + 3]
    assert not any("Extension modules" in line or 'File "' in line.split("] ", 1)[1]
                   for line in shown if line.startswith("[node1/"))
    # torchrun's own traceback after them is folded as before.
    assert any("of torchrun's own traceback left out" in line for line in shown)
