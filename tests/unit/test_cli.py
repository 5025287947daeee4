"""The CLI as a user meets it: help, version, and one-line errors without tracebacks."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from gpucluster import __version__
from tests.cli import gpucluster


def test_version_and_help() -> None:
    assert gpucluster("--version").stdout.strip() == f"gpucluster {__version__}"
    helped = gpucluster("--help")
    assert helped.code == 0
    for command in ("run", "inventory", "sandbox"):
        assert command in helped.stdout


def test_a_scripts_option_without_the_double_dash_says_where_it_goes() -> None:
    """`launch train.py --epochs 5` said `No such option: --epochs (Possible options:
    --detach)`; an unknown option before the script is still a typo of ours."""
    env = {"COLUMNS": "300"}  # the message on one line of rich's error box
    for name, options in (("launch", ["-w", "node1"]), ("export sbatch", ["-o", "job.sh"])):
        done = gpucluster(*name.split(), *options, "train.py", "--epochs", "5", env=env)
        assert done.code == 2 and "(Possible options" not in done.stderr, done.stderr
        assert (f"No such option: --epochs (fix: the script's own options go after --: "
                f"gpucluster {name} [OPTIONS] train.py -- --epochs ...)") in done.stderr, \
            done.stderr
    typo = gpucluster("launch", "--nproc-per-nod", "2", "train.py", env=env)
    # click's suggestion, in its own words (`(Possible options: ...)`, later `Did you mean`)
    assert re.search(r"No such option:? '?--nproc-per-nod\b.*--nproc-per-node", typo.stderr), \
        typo.stderr


def test_a_path_the_system_refuses_is_one_line_naming_it(tmp_path: Path) -> None:
    """An OSError about a user's path ended in a traceback where no check named it
    first: a name longer than the file system takes (-o, -C, --write-inventory)."""
    inventory = tmp_path / "c.yaml"
    inventory.write_text("hosts: [localhost]\n")
    long_name = tmp_path / ("y" * 300)
    done = gpucluster("inventory", "export", "-i", str(inventory), "-F", "ansible",
                      "-o", str(long_name))
    assert done.code == 2 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr == f"gpucluster: error: {long_name}: File name too long (fix: a " \
        f"shorter path)\n"


def test_output_into_a_full_disk_is_one_line_and_a_supervisor_goes_on_regardless(
        tmp_path: Path) -> None:
    """`gpucluster inventory show > f` on a full disk (here /dev/full) ended in rich's
    traceback. A process nobody watches (the --recover supervisor, its log on that
    disk) drops what it cannot write instead: it must go on recovering the job."""
    import os
    import subprocess
    import sys

    from gpucluster.lossy_output import UNWATCHED

    inventory = tmp_path / "c.yaml"
    inventory.write_text("hosts: [localhost]\n")

    def show(extra_env: dict[str, str]) -> subprocess.CompletedProcess[str]:
        with Path("/dev/full").open("w") as full:
            return subprocess.run(
                [sys.executable, "-m", "gpucluster", "inventory", "show", "-i", str(inventory)],
                stdout=full, stderr=subprocess.PIPE, text=True, timeout=60, check=False,
                env={**os.environ, **extra_env})

    watched = show({})
    assert watched.returncode == 2 and watched.stderr == (
        "gpucluster: error: a write failed: No space left on device (fix: free space where "
        "the output goes, or beside the inventory, in .gpucluster/)\n")
    unwatched = show({UNWATCHED: "1"})
    assert unwatched.returncode == 0 and unwatched.stderr == "", unwatched.stderr


def test_an_os_error_naming_no_file_is_a_bug_and_keeps_its_traceback() -> None:
    from gpucluster.os_errors import file_error

    assert file_error(OSError(22, "Invalid argument")) is None
    import gpucluster

    for shipped in (Path(gpucluster.__file__).parent / "gone.py",
                    Path(gpucluster.__file__).parents[1] / "templates" / "gone.j2"):
        assert file_error(OSError(2, "No such file or directory", str(shipped))) is None
    said = file_error(OSError(28, "No space left on device", "/out/b.tar.gz"))
    assert str(said) == "/out/b.tar.gz: No space left on device (fix: free space there, " \
        "or another path)"


def test_bad_inventory_is_reported_with_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "inventory.yaml"
    path.write_text("hosts:\n  - name: a\n    prot: 22\n  - name: a\n")
    result = gpucluster("inventory", "check", "-i", str(path))
    assert result.code == 2
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert lines == [
        f"gpucluster: error: {path}:3: unknown key 'prot' in host entry "
        f"(fix: did you mean 'port'?)",
        f"gpucluster: error: {path}:4: duplicate host 'a' (first defined on line 2) "
        f"(fix: remove one of them)",
    ]


def test_missing_inventory_names_all_three_places(tmp_path: Path) -> None:
    result = gpucluster("inventory", "show", cwd=str(tmp_path),
                        env={"GPUCLUSTER_INVENTORY": ""})
    assert result.code == 2
    assert "-i/--inventory" in result.stderr and "$GPUCLUSTER_INVENTORY" in result.stderr
    assert "Traceback" not in result.stderr


def test_inventory_from_environment_and_show(tmp_path: Path) -> None:
    path = tmp_path / "cluster.yaml"
    path.write_text("hosts:\n  - name: gpu[01-02]\n    address: 10.0.0.[1-2]\n")
    shown = gpucluster("inventory", "show", "--json", env={"GPUCLUSTER_INVENTORY": str(path)})
    assert shown.code == 0
    assert [h["address"] for h in shown.json()["hosts"]] == ["10.0.0.1", "10.0.0.2"]
    checked = gpucluster("inventory", "check", "-i", str(path))
    assert checked.code == 0 and "2 hosts" in checked.stdout


def test_run_on_localhost_needs_no_ssh(tmp_path: Path) -> None:
    path = tmp_path / "local.yaml"
    path.write_text("hosts: [localhost]\n")
    result = gpucluster("run", "-i", str(path), "--json", "echo hi")
    assert result.code == 0
    assert result.json()["hosts"][0]["stdout"] == "hi\n"
    # The command's words, as ssh and pdsh take them: options of ours go before it.
    words = gpucluster("run", "-i", str(path), "--json", "echo", "-n", "hi", "-L")
    assert words.code == 0, words.stderr
    assert words.json()["hosts"][0]["stdout"] == "hi -L"
    assert words.json()["command"] == "echo -n hi -L"
    # One of ours after the command was meant as ours: refused, not run everywhere.
    for late in ("-w", "--hosts=node1"):
        meant = gpucluster("run", "-i", str(path), "touch", str(tmp_path / "ran"), late,
                           "node1")
        assert meant.code == 2 and not (tmp_path / "ran").exists()
        assert meant.stderr == (
            f"gpucluster: error: gpucluster run: {late} after the command would be the "
            f"command's, yet it is one of our options (fix: ours go before the command, "
            f"gpucluster run {late} ... touch ...; for the command's own {late}, put -- "
            f"before the command or quote it whole)\n"), meant.stderr
    told = gpucluster("run", "-i", str(path), "--json", "--", "echo", "-w", "--json")
    assert told.code == 0 and told.json()["hosts"][0]["stdout"] == "-w --json\n"
    empty = gpucluster("run", "-i", str(path), " ")  # ran a login shell's nothing, exit 0
    assert empty.code == 2 and "COMMAND is empty: nothing would run (fix: " in empty.stderr
    # Out of time: what it printed so far is shown (how far did it get?), and the limit
    late = gpucluster("run", "-i", str(path), "-t", "1", "echo started; sleep 30")
    assert late.code == 1 and "localhost: started\n" in late.stdout, late.stdout
    assert "localhost: timed out" in late.stdout
    assert "(fix: the limit was 1s; give the command longer with --timeout" in late.stderr


def test_sandbox_without_root_says_what_is_needed() -> None:
    import os

    if os.geteuid() == 0:
        result = gpucluster("sandbox", "status", "--name", "gpcnone")
        assert result.code == 2 and "no sandbox 'gpcnone'" in result.stderr
    else:
        result = gpucluster("sandbox", "up", "--name", "gpcnone")
        assert result.code == 2 and "must run as root" in result.stderr


def _commands() -> dict[str, object]:
    """Every command's click object by its path, e.g. 'inventory check'."""
    from typer.main import get_command

    from gpucluster.cli.main import app

    found: dict[str, object] = {}

    def walk(group: object, prefix: str) -> None:
        for name, command in group.commands.items():  # type: ignore[attr-defined]
            path = f"{prefix} {name}".strip()
            if hasattr(command, "commands"):  # a group of sub-commands
                walk(command, path)
            else:
                found[path] = command
    walk(get_command(app), "")
    return found


def _help(path: str, columns: int = 200) -> str:
    from typer.testing import CliRunner

    from gpucluster.cli.main import app

    result = CliRunner().invoke(app, [*path.split(), "-h"], env={"COLUMNS": str(columns)})
    assert result.exit_code == 0, (path, result.output)
    return result.output


def test_every_command_takes_h_and_names_its_placeholders_plainly() -> None:
    for path in _commands():
        text = _help(path)
        usage = next(line for line in text.splitlines() if "Usage:" in line)
        assert "{" not in usage and "<bool>" not in text, (path, usage)
    assert "SCRIPT [ARGS]" in _help("launch") and "COMMAND" in _help("run")
    assert "[node/rank]" in _help("logs")  # not swallowed as rich markup


def test_command_lists_give_each_command_one_unbroken_summary() -> None:
    for group in ("", "inventory", "sandbox", "export"):
        lines = _help(group, columns=600).splitlines()
        start = next(i for i, line in enumerate(lines) if "Commands" in line)
        rows = lines[start + 1:next(i for i in range(start, len(lines))
                                     if lines[i].startswith("╰"))]
        # Wide enough for any summary: a row that is not a command's is a line break
        # kept from a docstring, which cut the summary mid-sentence
        assert rows and all(re.match(r"│ [a-z]", row) for row in rows), (group, rows)
    assert "image (and Slurm, --with slurm); a re-run changes nothing" in _help("", 600)


def test_a_commands_page_reflows_every_paragraph_of_its_docstring() -> None:
    """Typer keeps the line breaks of every paragraph after the first, so a wide
    terminal showed `top -h` as "...is marked" | "stale with its age"."""
    for path in _commands():
        # Wide enough for any paragraph: every non-empty line before the options box
        # is then one whole paragraph, ending where a sentence does
        lines = _help(path, columns=600).splitlines()
        end = next(i for i, line in enumerate(lines) if line.startswith("╭"))
        prose = [line.strip() for line in lines[:end] if line.strip()][1:]  # not Usage
        assert all(line.endswith((".", ")", ":")) for line in prose), (path, prose)
    assert "a node that stops answering is marked stale with its age." in _help("top", 600)


def test_reporting_commands_have_json_and_node_commands_select_hosts() -> None:
    commands = _commands()

    def options(path: str) -> set[str]:
        return {o for p in commands[path].params for o in p.opts}  # type: ignore[attr-defined]

    for path in ("run", "doctor", "provision", "smoke", "launch", "jobs", "stop",
                 "inventory show", "inventory check", "sandbox status"):
        assert "--json" in options(path), path
    for path in ("run", "doctor", "smoke", "launch"):
        assert {"-w", "--hosts", "-g", "--group"} <= options(path), path
    assert {"-w", "--hosts"} <= options("logs")
    assert {"--only", "--skip"} <= options("doctor") and {"--only", "--skip"} <= options(
        "provision")


def test_no_number_option_takes_nan_or_infinity() -> None:
    """float() reads `nan` and `inf` and no range refuses them: `--hang-timeout inf`
    ended in a traceback and `launch --grace nan` ran with a grace that never comes."""
    from typer import BadParameter

    taken = []
    for path, command in _commands().items():
        context = command.make_context(path, [], resilient_parsing=True)  # type: ignore[attr-defined]
        for param in command.params:  # type: ignore[attr-defined]
            if param.type.name not in ("float", "float range"):
                continue
            for value in ("nan", "inf", "-inf"):
                try:
                    param.process_value(context, value)
                    taken.append(f"{path} {param.opts[0]} {value}")
                except BadParameter:
                    pass
    assert not taken, taken


def test_inventory_check_json_lists_every_problem(tmp_path: Path) -> None:
    path = tmp_path / "inventory.yaml"
    path.write_text("hosts:\n  - name: a\n    prot: 22\n")
    result = gpucluster("inventory", "check", "-i", str(path), "--json")
    assert result.code == 2
    payload = result.json()
    assert payload["schema"] == 1 and payload["ok"] is False
    assert payload["problems"] == [{"file": str(path), "line": 3, "message":
                                    "unknown key 'prot' in host entry",
                                    "fix": "did you mean 'port'?"}]
    path.write_text("hosts: [a, b]\n")
    good = gpucluster("inventory", "check", "-i", str(path), "--json").json()
    assert good["ok"] is True and good["hosts"] == 2 and good["problems"] == []


def test_doctor_and_smoke_on_a_selection(tmp_path: Path) -> None:
    path = tmp_path / "inventory.yaml"
    path.write_text("hosts: [localhost]\ngroups: {g: localhost}\n")
    unknown = gpucluster("doctor", "-i", str(path), "-w", "nosuch")
    assert unknown.code == 2 and "--hosts names unknown hosts: nosuch (fix: the " \
        "inventory's hosts are " in unknown.stderr
    group = gpucluster("smoke", "-i", str(path), "-g", "nope")
    assert group.code == 2 and "no group 'nope'" in group.stderr


def test_a_reader_that_goes_away_ends_a_rich_table_with_141_not_1(tmp_path: Path) -> None:
    """rich ended a table written into a closed pipe with exit 1, which reads as "a check
    failed" (`doctor | head`); launch and logs -f already gave 141, as a shell reports a
    writer SIGPIPE ended. (click's own exit 1 for a plain write, `run ... | head`, is
    mended the same way; this machine's pipes do not fail a large write reliably.)"""
    import subprocess
    import sys

    many = tmp_path / "many.yaml"  # a table longer than a pipe holds
    many.write_text("hosts:\n  - {name: 'n[1-3000]', address: 'n[1-3000].example'}\n")
    done = subprocess.run(["bash", "-c", f"{sys.executable} -m gpucluster inventory show -i "
                           f"{many} | head -1 >/dev/null; echo ${{PIPESTATUS[0]}}"],
                          capture_output=True, text=True, timeout=60, check=True)
    assert done.stdout == "141\n" and "Traceback" not in done.stderr, done.stderr


def test_piped_passwords_come_ssh_first_then_sudo(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """--ask-pass and --ask-sudo-pass from a pipe: one line each, in that order, as the
    docs say; neither is in the options' repr."""
    import io
    import sys

    from gpucluster import inventory
    from gpucluster.cli.options import ssh_options

    path = tmp_path / "c.yaml"
    path.write_text("hosts:\n  - {name: a, address: 10.0.0.1}\n")
    monkeypatch.setattr(sys, "stdin", io.StringIO("ssh secret\nsudo secret\n"))
    options = ssh_options(inventory.load(path), False, True, None, ask_sudo_pass=True)
    assert (options.password, options.sudo_password) == ("ssh secret", "sudo secret")
    assert "secret" not in repr(options)
