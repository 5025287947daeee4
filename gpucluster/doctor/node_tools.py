"""The commands gpucluster's node scripts run beyond the shell's builtins that a minimal
node image (a container base, RHEL's ubi-minimal) may lack, and the GNU forms they use:
the probe looks for each, and doctor names the package that brings it."""

from __future__ import annotations

from dataclasses import dataclass

# command: its package (the same name on Debian/Ubuntu and RHEL/Fedora).
COMMANDS = {
    "tar": "tar",  # the work dir's sync (launch, export sbatch)
    "gzip": "gzip",  # the sync's tar is gzipped when small
    "find": "findutils",  # the sync's listing of the node's copy
    "xargs": "findutils",  # the sync's deletions
    "setsid": "util-linux",  # the job's own session, detached from SSH
    "bash": "bash",  # the log's stamper (bash's clock builtin)
    "timeout": "coreutils",  # limits on each tool a script waits for
    "awk": "gawk",  # the job's network interface variables; prune's sizes of job files
}
# command: (a test that fails without the GNU form the scripts use, its package).
GNU_FORMS = {
    "find": ("find / -maxdepth 0 -printf ''", "findutils"),  # the listing's -printf
    "tail": ("tail -n 0 --pid=1 /dev/null", "coreutils"),  # the logs' tail -F --pid
    "grep": ("printf 'a\\0' | grep -q -z a", "grep"),  # the job markers' grep -z
}


@dataclass(frozen=True)
class Lacking:
    command: str
    gnu_form: bool  # the command is there, but not the GNU form the scripts use

    @property
    def package(self) -> str:
        return GNU_FORMS[self.command][1] if self.gnu_form else COMMANDS[self.command]

    def __str__(self) -> str:
        return f"{self.command} (not GNU's)" if self.gnu_form else self.command


def parse(text: str) -> list[Lacking]:
    """The probe's `tools` section: a line `missing CMD` or `not-gnu CMD` for each."""
    found = []
    for line in text.splitlines():
        kind, _, command = line.strip().partition(" ")
        if kind == "missing" and command in COMMANDS:
            found.append(Lacking(command, False))
        elif kind == "not-gnu" and command in GNU_FORMS:
            found.append(Lacking(command, True))
    return found
