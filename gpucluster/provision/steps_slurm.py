"""Step `slurm`: munge with one key, configless Slurm built from the nodes' own facts,
daemons started the node's way, then verified: every node idle in sinfo, credentials
accepted across nodes, `srun -N <n> hostname` answered by all.

Cluster-wide: nodes are checked one by one, then brought up in order (munge and files
everywhere, slurmctld, then every slurmd), since slurmd fetches its configuration from
slurmctld."""

from __future__ import annotations

import dataclasses
import hashlib
import os
from collections.abc import Sequence
from pathlib import Path
from typing import TypeVar

from gpucluster.errors import GpuclusterError
from gpucluster.inventory import Host, SlurmSettings
from gpucluster.provision import files
from gpucluster.provision.logged import LoggedConnection
from gpucluster.provision.model import Change, Each, ProvisionContext, Step
from gpucluster.remote.result import FailureKind, FanoutResult, RemoteError
from gpucluster.slurm import config, verify
from gpucluster.slurm.facts import NodeFacts, facts_script, install_command, missing, parse_facts
from gpucluster.slurm.queue import kept_munge_key
from gpucluster.slurm_states import is_healthy, problem_of
from gpucluster.templating import render

T = TypeVar("T")
READY_TIMEOUT_S = 30
HEALTHY_TIMEOUT_S = 60
SRUN_TIMEOUT_S = 60


def settings_of(context: ProvisionContext) -> SlurmSettings:
    return context.slurm or SlurmSettings()


def munge_key(state_dir: Path, create: bool) -> bytes | None:
    """The cluster's munge key, kept (0600) beside the cluster key; made once."""
    path = kept_munge_key(state_dir)
    if not path.exists():
        if not create:
            return None
        path.parent.mkdir(mode=0o700, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as handle:
            handle.write(os.urandom(128))  # munge's own mungekey makes 1024 bits
    return path.read_bytes()


def key_state(key: bytes | None) -> str | None:
    """The munge key as the facts report one that is right: 0400 munge:munge, our sha."""
    return f"400 munge munge {hashlib.sha256(key).hexdigest()}" if key else None


def daemons_script(conf_server: str, start: Sequence[str] = (), restart: Sequence[str] = (),
                   stop: Sequence[str] = ()) -> str:
    """Shell that stops, (re)starts or starts if down each daemon, then waits until the
    ones started answer."""
    return render("slurm/daemons.sh.j2", conf_server=conf_server, start=list(start),
                  restart=list(restart), stop=list(stop), ready_timeout_s=READY_TIMEOUT_S)


class SlurmStep(Step):
    name = "slurm"
    summary = "munge, configless Slurm from the nodes' facts, verified with srun"
    cluster_wide = True

    undone = ("path removed", "paths removed")

    def needs_root(self, context: ProvisionContext) -> bool:
        return True

    # -- gathering

    @staticmethod
    def _facts_script() -> str:
        return facts_script() + files.read_script(config.managed_paths())

    def reads(self, context: ProvisionContext) -> list[tuple[str, bool]]:
        return [(self._facts_script(), True)]

    def prepare(self, context: ProvisionContext, each: Each) -> None:
        settings = settings_of(context)
        controller = config.controller_name(settings, context.inventory)
        script = self._facts_script()
        answers = each(lambda host, connection: parse_facts(
            host.name, host.address, connection.run(script, timeout=60, sudo=True).stdout))
        # In the inventory's order: slurm.conf must not change with who answered first.
        facts = {h.name: answers.values[h.name] for h in context.inventory.hosts
                 if h.name in answers.values}
        context.gathered["slurm"] = facts
        context.gathered["slurm_unreachable"] = {n: f.message for n, f in
                                                 answers.failures.items()}
        context.gathered["slurm_key"] = munge_key(context.state_dir,
                                                  create=not context.dry_run)
        context.gathered["slurm_controller"] = controller
        states: dict[str, tuple[str, str]] = {}
        ctl = facts.get(controller)
        if ctl is not None and "slurmctld" in ctl.daemons:
            connection = each(lambda _h, c: c, [context.inventory.host(controller)])
            if controller in connection.values:
                states = verify.node_states(connection.values[controller])
        context.gathered["slurm_states"] = states

    def _facts(self, context: ProvisionContext) -> tuple[dict[str, NodeFacts], NodeFacts]:
        facts: dict[str, NodeFacts] = context.gathered["slurm"]
        controller = context.gathered["slurm_controller"]
        lost = context.gathered["slurm_unreachable"]
        if controller not in facts:
            raise GpuclusterError(f"the Slurm controller host {controller} did not answer: "
                                  f"{lost.get(controller, 'unreachable')}")
        if lost:
            raise GpuclusterError(f"slurm.conf needs every node's facts, and "
                                  f"{', '.join(sorted(lost))} did not answer")
        return facts, facts[controller]

    # -- per node

    def check(self, context: ProvisionContext, host: Host,
              connection: LoggedConnection) -> list[Change]:
        facts, controller = self._facts(context)
        node = facts[host.name]
        is_controller = node.host == controller.host
        changes: list[Change] = []
        lacking = missing(node, is_controller)
        if lacking:
            command = install_command(node, lacking)
            if not settings_of(context).install:
                fix = f"sudo {command}" if command else "install Slurm and munge"
                raise GpuclusterError(f"{', '.join(lacking)} not installed (fix: {fix} on "
                                      f"{host.name}, or set slurm.install: true)")
            if command is None:
                raise GpuclusterError(f"{', '.join(lacking)} not installed, and no package "
                                      f"manager gpucluster knows was found")
            changes.append(Change(f"install: {command}", command))
            node = dataclasses.replace(node, node_name=node.node_name or host.name)
        elif not node.node_name or not node.hardware:
            raise GpuclusterError("`slurmd -C` printed no hardware line: is slurmd working?")
        uncountable = [f.host for f in facts.values() if f.uncountable]
        if uncountable and (is_controller or host.name in uncountable):
            raise GpuclusterError(
                f"nvidia-smi lists GPUs on {', '.join(uncountable)} but there is no "
                f"/dev/nvidia[0-9]* and slurmd has no NVML plugin, so Slurm cannot count "
                f"them (fix: `sudo nvidia-modprobe -c 0 -u` or run nvidia-smi once as root "
                f"to create the device files)")
        key = context.gathered["slurm_key"]
        if node.key is None or node.key != key_state(key):
            changes.append(Change("munge key: write the cluster's key (0400 munge:munge)",
                                  "/etc/munge/munge.key: " + (
                                      "absent" if node.key is None else "another key or mode")))
        changes += self._file_changes(context, node, controller, facts)
        changes += self._daemon_changes(context, node, is_controller)
        return changes

    def _file_changes(self, context: ProvisionContext, node: NodeFacts,
                      controller: NodeFacts, facts: dict[str, NodeFacts]) -> list[Change]:
        states = files.parse_states(node.files, config.managed_paths())
        changes = []
        for wanted in config.files_for(context.inventory.cluster.name, settings_of(context),
                                       node, controller, list(facts.values())):
            current = states[wanted.path]
            if current.text != wanted.text or current.mode != wanted.mode:
                changes.append(Change(f"write {wanted.path}",
                                      files.diff(wanted.path, current.text, wanted.text)))
        return changes

    def _daemon_changes(self, context: ProvisionContext, node: NodeFacts,
                        is_controller: bool) -> list[Change]:
        wanted = ["munged", *(["slurmctld"] if is_controller else []), "slurmd"]
        changes = [Change(f"start {d}") for d in wanted if d not in node.daemons]
        state = context.gathered["slurm_states"].get(node.node_name)
        if "slurmd" in node.daemons and state and not is_healthy(state[0]):
            changes.append(Change(f"restart slurmd: {problem_of(*state)}"))
        return changes

    # -- bringing it up

    def apply_all(self, context: ProvisionContext, each: Each, targets: list[Host],
                  connections: dict[str, LoggedConnection]) -> dict[str, str | None]:
        facts, controller = self._facts(context)
        key = context.gathered["slurm_key"]
        problems: dict[str, str | None] = {h.name: None for h in targets}
        lacking = [h for h in targets if missing(facts[h.name], h.name == controller.host)]
        if lacking:  # slurm.install: install, then read the facts again (slurmd -C now runs)
            self._record(problems, each(lambda h, c: self._run(c, install_command(
                facts[h.name], missing(facts[h.name], h.name == controller.host)) or "false",
                900), lacking))
            self.prepare(context, each)
            facts, controller = self._facts(context)
        conf_changed = {h.name for h in targets if any(
            c.summary.startswith(("write /etc/slurm/", "write /etc/systemd", "install"))
            for c in self._checked(context, h, connections[h.name]))}

        def prepare_node(host: Host, connection: LoggedConnection) -> None:
            node = facts[host.name]
            wanted = config.files_for(context.inventory.cluster.name, settings_of(context),
                                      node, controller, list(facts.values()))
            parents = " ".join(sorted({str(Path(w.path).parent) for w in wanted}))
            # The key and every file in one round trip; private: always the step's mode.
            files.write_all(connection, [
                files.NewFile(config.MUNGE_KEY, key.decode("utf-8", "surrogateescape")
                              if key else "", "400", private=True, owner="munge:munge"),
                *(files.NewFile(f.path, f.text, f.mode, private=True) for f in wanted)],
                sudo=True, before=f"install -d -o munge -g munge -m 0700 /etc/munge && "
                                  f"mkdir -p {parents}")
            restart = ["munged"] if node.key != key_state(key) else []
            self._run(connection, daemons_script(config.conf_server(controller),
                                                 start=["munged"], restart=restart), 120)

        self._record(problems, each(prepare_node, [h for h in targets
                                                   if problems.get(h.name) is None]))
        server = config.conf_server(controller)
        ctl_host = context.inventory.host(controller.host)
        if problems.get(controller.host) is None:
            restart = controller.host in conf_changed
            script = daemons_script(server, restart=["slurmctld"]) if restart else \
                daemons_script(server, start=["slurmctld"])
            ctl = each(lambda _h, c: self._run(c, script, 120), [ctl_host])
            self._record(problems, ctl)
        restart_all = controller.host in conf_changed
        slurmd_hosts = [h for h in context.inventory.hosts
                        if problems.get(h.name) is None
                        and (restart_all or h.name in problems)]
        self._record(problems, each(lambda _h, c: self._run(c, daemons_script(
            server, restart=["slurmd"]), 120), slurmd_hosts))
        self._verify(context, each, controller, facts, problems)
        return problems

    def _checked(self, context: ProvisionContext, host: Host,
                 connection: LoggedConnection) -> list[Change]:
        try:
            return self.check(context, host, connection)
        except GpuclusterError:
            return [Change("install")]

    def _verify(self, context: ProvisionContext, each: Each, controller: NodeFacts,
                facts: dict[str, NodeFacts], problems: dict[str, str | None]) -> None:
        names = {f.node_name or f.host: f.host for f in facts.values()}
        connected = each(lambda _h, c: c)
        ctl = connected.values.get(controller.host)
        if ctl is None:
            return
        unhealthy = verify.wait_healthy(ctl, sorted(names), HEALTHY_TIMEOUT_S)
        for name, problem in unhealthy.items():
            problems[names[name]] = problem
        for host, problem in verify.munge_across(ctl, controller.host,
                                                 connected.values).items():
            problems[host] = problems.get(host) or problem
        if not unhealthy:
            failed = verify.srun_everywhere(ctl, sorted(names), SRUN_TIMEOUT_S)
            if failed:
                for host in names.values():
                    problems[host] = problems.get(host) or failed

    @staticmethod
    def _record(problems: dict[str, str | None], result: FanoutResult[T]) -> None:
        for name, failure in result.failures.items():
            problems[name] = problems.get(name) or failure.message

    @staticmethod
    def _run(connection: LoggedConnection, command: str, timeout: float = 60) -> None:
        result = connection.run(command, timeout=timeout, sudo=True)
        if not result.ok:
            first = command.splitlines()[0] if command.strip() else command
            raise RemoteError(FailureKind.ERROR, f"`{first}` failed: "
                              f"{(result.stderr.strip() or result.stdout.strip())[-300:]}")

    # -- undo

    def undo(self, context: ProvisionContext, host: Host,
             connection: LoggedConnection) -> list[str]:
        """Stop the daemons, remove the files the step wrote (the munge key only when it
        is ours) and Slurm's cached configuration and state."""
        key = munge_key(context.state_dir, create=False)
        ours = hashlib.sha256(key).hexdigest() if key else "none"
        paths = " ".join(config.managed_paths())
        script = daemons_script("", stop=["slurmd", "slurmctld", "munged"]) + render(
            "slurm/undo.sh.j2", paths=paths, key=config.MUNGE_KEY, ours=ours)
        result = connection.run(script, timeout=120, sudo=True)
        if not result.ok:
            raise GpuclusterError(f"undo failed: {result.stderr.strip()[-300:]}")
        return result.stdout.split()

    def forget(self, context: ProvisionContext) -> None:
        """The controller's munge key says Slurm is set up from here (jobs, top and the
        exporter ask its queue; the firewall keeps its ports): gone with Slurm."""
        kept_munge_key(context.state_dir).unlink(missing_ok=True)
