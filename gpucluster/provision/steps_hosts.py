"""Step `hosts`: a managed block in /etc/hosts mapping every node's name (and its real
hostname, where that differs) to its cluster address. Placed at the top, so it wins over
a distribution's `127.0.1.1 <hostname>` line; lines outside the block are never touched."""

from __future__ import annotations

from gpucluster.inventory import Host, is_ip
from gpucluster.provision import files
from gpucluster.provision.logged import LoggedConnection
from gpucluster.provision.model import (
    HOSTNAME_COMMAND,
    Change,
    Each,
    ProvisionContext,
    Step,
    hostnames,
)
from gpucluster.templating import render

HOSTS_FILE = "/etc/hosts"


class HostsStep(Step):
    name = "hosts"
    summary = "/etc/hosts block: every node's name -> its cluster address"
    changes_only_own_reads = True  # /etc/hosts: no other step reads it

    def __init__(self) -> None:
        self._seen: dict[str, files.FileState] = {}  # by node: what check read

    def needs_root(self, context: ProvisionContext) -> bool:
        return True

    def note(self, context: ProvisionContext, host: Host) -> str:
        return str(context.gathered.get("hostname_notes", {}).get(host.name, ""))

    def reads(self, context: ProvisionContext) -> list[tuple[str, bool]]:
        # Read as root, as it is written: the write reads it back in its own round trip,
        # and that answers the re-check (the step needs root, dry runs included).
        return [(HOSTNAME_COMMAND, False), (files.read_script([HOSTS_FILE]), True)]

    def prepare(self, context: ProvisionContext, each: Each) -> None:
        hostnames(context, each)

    def block(self, context: ProvisionContext) -> list[str]:
        names_seen = context.gathered.get("hostnames", {})
        entries = []
        for host in context.inventory.hosts:
            if not is_ip(host.address):
                continue  # a DNS name resolves through DNS; /etc/hosts needs addresses
            names = [host.name]
            real = names_seen.get(host.name)
            if isinstance(real, str) and real and real not in names:
                names.append(real)
            entries.append({"address": host.address, "names": names})
        return render("provision/hosts_block.j2", entries=entries).splitlines()

    def check(self, context: ProvisionContext, host: Host,
              connection: LoggedConnection) -> list[Change]:
        current = self._seen[host.name] = files.read_state(connection, HOSTS_FILE,
                                                           sudo=True)
        desired = self._desired(context, current)
        if desired == current.text:
            return []
        return [Change(f"write the managed block in {HOSTS_FILE}",
                       files.diff(HOSTS_FILE, current.text, desired))]

    def _desired(self, context: ProvisionContext, current: files.FileState) -> str:
        return files.with_block(current.text, self.block(context), at_top=True,
                                name=context.inventory.cluster.name)

    def apply(self, context: ProvisionContext, host: Host, connection: LoggedConnection,
              changes: list[Change]) -> None:
        current = self._seen[host.name]  # a file changed since check read it is left alone
        files.write_all(connection, [files.NewFile(
            HOSTS_FILE, self._desired(context, current), "644", was=current)], sudo=True)

    def undo(self, context: ProvisionContext, host: Host,
             connection: LoggedConnection) -> list[str]:
        """The cluster's managed block goes; every other line stays as it is."""
        current = files.read(connection, HOSTS_FILE, sudo=True)
        kept = files.without_block(current or "", context.inventory.cluster.name)
        if current is None or kept == current:
            return []
        files.write_atomically(connection, HOSTS_FILE, kept, "644", sudo=True)
        return [HOSTS_FILE]
