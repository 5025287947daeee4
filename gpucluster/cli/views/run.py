"""`gpucluster run`: outputs folded clush-style, a failure summary, JSON."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.markup import escape

from gpucluster import hostrange
from gpucluster.remote.result import SUDO_N_REFUSAL, CommandResult, FailureKind, FanoutResult
from gpucluster.wording import counted


def run_payload(command: str, result: FanoutResult[CommandResult]) -> dict[str, Any]:
    hosts = []
    for name in result.hosts:
        value = result.values.get(name)
        failure = result.failures.get(name)
        hosts.append({
            "host": name,
            "ok": value is not None and value.ok,
            "exit_code": value.exit_code if value else None,
            "signal": value.signal if value else None,
            "stdout": value.stdout if value else None,
            "stderr": value.stderr if value else None,
            "duration_s": round(value.duration_s, 3) if value else None,
            "error": {"kind": failure.kind.value, "message": failure.message,
                      "output": failure.output}
            if failure else None,
        })
    return {"command": command, "hosts": hosts,
            "failed": [h["host"] for h in hosts if not h["ok"]]}


def fold_outputs(result: FanoutResult[CommandResult]
                 ) -> list[tuple[list[str], str, CommandResult]]:
    """Hosts grouped by identical output and ending (`exit 0`, `killed by SIGKILL`), in
    order of first appearance, each group with its first host's result."""
    answered = [(name, result.values[name]) for name in result.hosts if name in result.values]
    groups = hostrange.hosts_by(((value.stdout + value.stderr, value.ending), name)
                                for name, value in answered)
    return [(hosts, output, result.values[hosts[0]]) for (output, _), hosts in groups.items()]


def print_run(console: Console, result: FanoutResult[CommandResult]) -> None:
    """clush -b: a shared output under its folded host list, a unique one line-prefixed.
    The hosts' text is written as they sent it, not through rich: rich would expand tabs,
    wrap long lines and take a line's time (seconds for 100k lines)."""
    for hosts, output, first in fold_outputs(result):
        folded = hostrange.fold(hosts)
        _print_output(console, hosts, output)
        if first.killed:
            console.print(f"[yellow]{escape(folded)}: {first.ending} (no exit code)[/]")
        elif first.exit_code != 0:
            console.print(f"[yellow]{escape(folded)}: exited with exit code "
                          f"{first.exit_code}[/]")
    printed = hostrange.hosts_by((result.failures[name].output, name)
                                 for name in result.failed_hosts)
    for output, names in printed.items():  # what a command out of time had printed
        _print_output(console, names, output)
    failed = hostrange.hosts_by(
        ((result.failures[name].kind.value, result.failures[name].message), name)
        for name in result.failed_hosts)
    for (kind, message), names in failed.items():  # a typo fails every node alike
        console.print(f"[bold red]{escape(hostrange.fold(names))}: {kind}:[/] "
                      f"{escape(message)}")


def _print_output(console: Console, hosts: list[str], output: str) -> None:
    """Under a folded host list when several hosts printed it, else line-prefixed."""
    lines = output.rstrip("\n").split("\n") if output else []
    folded = hostrange.fold(hosts)
    if len(hosts) > 1 and lines:
        console.print(f"[bold cyan]{'-' * 15}\n{escape(folded)} ({len(hosts)})"
                      f"\n{'-' * 15}[/]")
        _write(console, "".join(f"{line}\n" for line in lines))
    else:
        prefix = _styled(console, f"[cyan]{escape(folded)}:[/] ")
        _write(console, "".join(f"{prefix}{line}\n" for line in lines))


def _styled(console: Console, markup: str) -> str:
    """`markup` as this console would print it (colour only where it prints colour)."""
    with console.capture() as captured:
        console.print(markup, end="")
    return captured.get()


def _write(console: Console, text: str) -> None:
    console.file.write(text)
    console.file.flush()


def timeout_fix(result: FanoutResult[CommandResult], limit_s: float) -> str:
    """For hosts whose command ran out of time: what the limit was and how to raise it."""
    if not any(f.kind is FailureKind.TIMED_OUT for f in result.failures.values()):
        return ""
    return (f" (fix: the limit was {limit_s:g}s; give the command longer with --timeout "
            f"SECONDS, or set cluster.command_timeout in the inventory)")


def sudo_password_fix(result: FanoutResult[CommandResult]) -> str:
    """For `run --sudo` without a password, where sudo -n itself refused: a rule that
    asks for one, which --ask-sudo-pass answers. Only where that refusal is all the
    command said, so that a command's own sudo is not taken for ours."""
    refused = [name for name, value in result.values.items()
               if value.exit_code == 1 and value.stderr.strip() == f"sudo: {SUDO_N_REFUSAL}"]
    if not refused:
        return ""
    return (f" (fix: sudo asks a password on {hostrange.fold(sorted(refused))}: add "
            f"--ask-sudo-pass)")


def failure_summary(result: FanoutResult[CommandResult]) -> str | None:
    """One line naming every host that failed and why; None when all succeeded."""
    reasons: list[tuple[str, str]] = []
    for name in result.hosts:
        failure = result.failures.get(name)
        value = result.values.get(name)
        if failure is not None:
            reasons.append((failure.kind.value, name))
        elif value is not None and not value.ok:
            reasons.append((value.ending, name))
    if not reasons:
        return None
    folded = ", ".join(f"{hostrange.fold(names)} ({reason})"
                       for reason, names in hostrange.hosts_by(reasons).items())
    return f"{len(reasons)} of {counted(len(result.hosts), 'host')} failed: {folded}"
