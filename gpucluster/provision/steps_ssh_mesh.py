"""Step `ssh-mesh`: every node can SSH to every other node as the job user.

A cluster key pair is generated once, kept in the state directory (0600), and installed
on every node as ~/.ssh/gpucluster_ed25519 (always 0600). authorized_keys gains its
public key, usable from the cluster's addresses only (other lines kept, no duplicates).
known_hosts gets a managed block with every node's real host keys, collected through
the controller's own verified connections (never StrictHostKeyChecking=no), and
~/.ssh/config a managed block that makes `ssh node2` use the cluster key. Afterwards
every ordered pair is tried, in parallel."""

from __future__ import annotations

import subprocess
from pathlib import Path

from gpucluster.errors import GpuclusterError
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
from gpucluster.remote.connection import shell_path
from gpucluster.remote.hostkeys import known_hosts_name
from gpucluster.templating import render

HOST_KEYS_COMMAND = "cat /etc/ssh/ssh_host_*_key.pub"

KEY_NAME = "gpucluster_ed25519"  # the default cluster name's


def key_name(cluster_name: str) -> str:
    """The cluster key's file name: one per cluster name, so that a node in two
    inventories keeps both clusters' keys."""
    return f"{cluster_name}_ed25519"
PAIR_TIMEOUT_S = 10
PAIR_CONNECT_TIMEOUT_S = 5  # each pair's ssh gives up connecting after this long


def cluster_key(state_dir: Path, create: bool, cluster_name: str = "gpucluster"
                ) -> tuple[str, str]:
    """(private key, public key line) of the cluster, generated on first use."""
    private = state_dir / key_name(cluster_name)
    if not private.exists():
        if not create:
            return "<generated on the first real run>", "<cluster public key>"
        state_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        done = subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C",
                               f"{cluster_name}-cluster", "-f", str(private)],
                              capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise GpuclusterError(f"ssh-keygen failed: {done.stderr.strip()}")
    private.chmod(0o600)
    return private.read_text(), Path(f"{private}.pub").read_text().strip()


def authorized_with(lines: list[str], public: str, addresses: list[str]) -> list[str]:
    """authorized_keys with the cluster key allowed from the cluster's addresses only
    (`from=`: a stolen key is no use from elsewhere). sshd matches from= against the
    peer's IP (names only with UseDNS), so with a DNS name among the addresses the key
    is left unrestricted. The key's other lines (other options, or none) are replaced
    in place; every other line is kept as it is."""
    blob = public.split()[1]
    wanted = (f'from="{",".join(addresses)}" {public}' if all(is_ip(a) for a in addresses)
              else public)
    result: list[str] = []
    for line in lines:
        if blob in line.split():
            if wanted not in result:
                result.append(wanted)
            continue
        result.append(line)
    return result if wanted in result else [*result, wanted]


def _private_key_path(context: ProvisionContext) -> str:
    return f"~/.ssh/{key_name(context.inventory.cluster.name)}"


class SshMeshStep(Step):
    name = "ssh-mesh"
    summary = "cluster key pair, authorized_keys, known_hosts and ssh config on every node"
    changes_only_own_reads = True  # the job user's ~/.ssh: no other step reads it

    def __init__(self) -> None:
        self._seen: dict[str, dict[str, files.FileState]] = {}  # by node: what check read

    def note(self, context: ProvisionContext, host: Host) -> str:
        return str(context.gathered.get("hostname_notes", {}).get(host.name, ""))

    def prepare(self, context: ProvisionContext, each: Each) -> None:
        private, public = cluster_key(context.state_dir, create=not context.dry_run,
                                      cluster_name=context.inventory.cluster.name)
        context.gathered["cluster_key"] = {"private": private, "public": public}
        keys = each(lambda _host, connection: connection.run(
            HOST_KEYS_COMMAND, timeout=30).stdout)
        context.gathered["host_keys"] = dict(keys.values)
        hostnames(context, each)

    def _files(self, context: ProvisionContext, host: Host,
               current: dict[str, str | None]) -> dict[str, tuple[str, str]]:
        """path -> (mode for a new file, desired content), built on the current files."""
        key = context.gathered["cluster_key"]
        public = str(key["public"])
        authorized = current["~/.ssh/authorized_keys"] or ""
        authorized_lines = authorized_with(files.lines_of(authorized), public,
                                           [h.address for h in context.inventory.hosts])
        known = []
        host_keys = context.gathered["host_keys"]
        names_seen = context.gathered["hostnames"]
        peers = [p for p in context.inventory.hosts if p.name in host_keys]
        for peer in peers:
            names = dict.fromkeys([peer.name, str(names_seen.get(peer.name) or peer.name),
                                   peer.address])
            listed = ",".join(known_hosts_name(n, peer.port) for n in names)
            for line in str(host_keys[peer.name]).splitlines():
                parts = line.split()
                if len(parts) >= 2:
                    known.append(f"{listed} {parts[0]} {parts[1]}")
        name = context.inventory.cluster.name
        private = _private_key_path(context)
        config = render("provision/ssh_config_block.j2", peers=peers, key=private,
                        hostnames=names_seen).splitlines()
        return {
            private: ("600", str(key["private"])),
            f"{private}.pub": ("644", public + "\n"),
            "~/.ssh/authorized_keys": ("600", "\n".join(authorized_lines) + "\n"),
            "~/.ssh/known_hosts": ("600", files.with_block(current["~/.ssh/known_hosts"], known,
                                                           name=name)),
            "~/.ssh/config": ("600", files.with_block(current["~/.ssh/config"], config,
                                                      at_top=True, name=name)),
        }

    @staticmethod
    def _paths(context: ProvisionContext) -> list[str]:
        private = _private_key_path(context)
        return [private, f"{private}.pub", "~/.ssh/authorized_keys", "~/.ssh/known_hosts",
                "~/.ssh/config"]

    def reads(self, context: ProvisionContext) -> list[tuple[str, bool]]:
        return [(HOST_KEYS_COMMAND, False), (HOSTNAME_COMMAND, False),
                (files.read_script(self._paths(context)), False)]

    def _current(self, context: ProvisionContext, connection: LoggedConnection
                 ) -> dict[str, files.FileState]:
        return files.read_states(connection, self._paths(context))

    def check(self, context: ProvisionContext, host: Host,
              connection: LoggedConnection) -> list[Change]:
        if host.name not in context.gathered["host_keys"]:
            raise GpuclusterError(f"{host.name}: its host keys could not be read")
        current = self._seen[host.name] = self._current(context, connection)
        texts = {path: state.text for path, state in current.items()}
        private = _private_key_path(context)  # always 0600, whatever mode the file had
        changes = []
        for path, (mode, content) in self._files(context, host, texts).items():
            if texts[path] != content:
                shown = "<private key>" if path == private else None
                changes.append(Change(f"write {path}", shown or files.diff(
                    path, texts[path], content)))
            elif path == private and current[path].mode != mode:
                changes.append(Change(f"make {path} mode {mode} (it is {current[path].mode})"))
        return changes

    def apply(self, context: ProvisionContext, host: Host, connection: LoggedConnection,
              changes: list[Change]) -> None:
        # On what check read, in one round trip: a file changed since is left alone.
        current = self._seen[host.name]
        texts = {path: state.text for path, state in current.items()}
        private = _private_key_path(context)
        files.write_all(connection, [
            files.NewFile(path, content, mode, private=path == private, was=current[path])
            for path, (mode, content) in self._files(context, host, texts).items()
            if texts[path] != content or (path == private and current[path].mode != mode)],
            before="mkdir -p ~/.ssh && chmod 700 ~/.ssh", read_back=self._paths(context))

    def undo(self, context: ProvisionContext, host: Host,
             connection: LoggedConnection) -> list[str]:
        """The cluster key's files and its authorized_keys line, and the cluster's
        known_hosts and ssh config blocks go; every other line and key stays. The
        controller keeps its copy of the key: a later provision installs the same one."""
        name = context.inventory.cluster.name
        private = _private_key_path(context)
        states = self._current(context, connection)
        current = {path: state.text for path, state in states.items()}
        # The key's line is known by its blob: from the node's copy, or the controller's.
        controllers = context.state_dir / f"{key_name(name)}.pub"
        publics = [current[f"{private}.pub"] or "",
                   controllers.read_text() if controllers.exists() else ""]
        blobs = {p.split()[1] for p in publics if len(p.split()) >= 2}
        authorized = current["~/.ssh/authorized_keys"] or ""
        lines = files.lines_of(authorized)
        others = [line for line in lines if not blobs & set(line.split())]
        kept = {"~/.ssh/authorized_keys": authorized if others == lines else
                "\n".join(others) + ("\n" if others else ""),
                "~/.ssh/known_hosts": files.without_block(current["~/.ssh/known_hosts"] or "",
                                                          name),
                "~/.ssh/config": files.without_block(current["~/.ssh/config"] or "", name)}
        changed = [path for path, text in kept.items()
                   if current[path] is not None and text != current[path]]
        if changed:
            files.write_all(connection, [files.NewFile(path, kept[path], "600",
                                                       was=states[path]) for path in changed])
        gone = [path for path in (private, f"{private}.pub") if current[path] is not None]
        if gone:
            connection.run("rm -f " + " ".join(shell_path(path) for path in gone), timeout=30)
        return changed + gone

    def verify(self, context: ProvisionContext, each: Each) -> dict[str, dict[str, str]]:
        """Every ordered pair: can this node log in to the peer (host key verified, key
        accepted)? -> matrix."""
        names = [h.name for h in context.inventory.hosts]
        # A node this run could not reach is not dialled from every other one: each pair
        # would wait its connect timeout to learn what the controller already knows.
        untried = {name: failure.kind.value for name, failure in context.down.items()}

        def probe(host: Host, connection: LoggedConnection) -> dict[str, str]:
            script = render("provision/ssh_pairs.sh.j2", timeout=PAIR_CONNECT_TIMEOUT_S,
                            peers=[n for n in names if n != host.name and n not in untried])
            output = connection.run(script, timeout=PAIR_TIMEOUT_S * 2).stdout
            found = dict(line.split() for line in output.splitlines() if len(line.split()) == 2)
            return {**found, **{n: why for n, why in untried.items() if n != host.name}}

        result = each(probe)
        matrix = {name: dict(row) for name, row in result.values.items()}
        for name, failure in result.failures.items():
            matrix[name] = {peer: failure.kind.value for peer in names if peer != name}
        return matrix
