"""A started job from outside: its state on every node, and stopping it (TERM, then
KILL) with confirmation that nothing of it is left."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence

from gpucluster import reports
from gpucluster.errors import GpuclusterError
from gpucluster.inventory import Host, Inventory
from gpucluster.launch import node_scripts
from gpucluster.launch.jobs import JobRecord, JobStore
from gpucluster.launch.model import DEFAULT_GRACE_S, NodeState, StopResult, parse_state
from gpucluster.remote.connection import Connection
from gpucluster.remote.session import Session

_STOP_HINT = re.compile(r" ?\(gpucluster stop \S+ ends it there\)$")  # stop_peers.sh's
PRESENT = ("running", "stopping", "leftover")  # states with processes of the job there


def stop(session: Session, inventory: Inventory, record: JobRecord,
         grace_s: float = DEFAULT_GRACE_S, nodes: Sequence[str] | None = None,
         dump_stacks: bool = False) -> dict[str, StopResult]:
    """TERM the job on every node (its torchrun, which passes it on to its workers; what
    outlives torchrun after it), KILL what is left after `grace_s`, and report what was
    found and whether anything survived. `dump_stacks` (a hang): every worker on every
    node is first stopped where it is, then each aborted, writing its Python stack
    (hang_stacks)."""
    hosts = hosts_of(inventory, record, nodes)

    if dump_stacks:  # every worker held where it hangs, then aborted
        runtimes = record.container_runtime
        held = [host for host in hosts if node_scripts.stacks_reachable(
            record, runtimes.get(host.name))]
        session.map(held, lambda connection: connection.run(node_scripts.freeze_script(
            record, connection.host, runtimes.get(connection.host)), timeout=30))

    def stop_on(connection: Connection) -> StopResult:
        script = node_scripts.stop_script(record, connection.host, grace_s,
                                          record.container_runtime.get(connection.host),
                                          dump_stacks)
        result = connection.run(script, timeout=grace_s + 30)
        return stop_result(connection.host, result.stdout, result.stderr)

    done = session.map(hosts, stop_on)
    results = dict(done.values)
    for node, failure in done.failures.items():
        results[node] = StopResult(node, 0, "unreachable", (), failure.message)
    return results


def stop_result(node: str, stdout: str, stderr: str = "") -> StopResult:
    """What a node's stop script reported: `@@gpc stop HOW FOUND LEFT`, a container
    left, and each aborted rank's stack (`@@gpc section stack RANK FATE`: how it ended,
    died, stopped or alive) and py-spy's read of it before (`@@gpc section spy RANK`)."""
    found_reports = reports.by_kind(stdout)
    how, found, left = ([*found_reports.get("stop", [""])[0].split(), "", "", ""])[:3]
    if not how:
        return StopResult(node, 0, "error", (), (stderr or stdout).strip()[-200:])
    pids = tuple(int(p) for p in left.split(",") if p.isdigit())
    count = int(found) if found.isdigit() else 0
    containers = found_reports.get("container-left", [])
    if containers:  # its processes may be invisible to us; the engine still runs it
        return StopResult(node, count, "error", pids,
                          f"container {containers[0]} is still running")
    stacks, fates, spied = {}, {}, {}
    for name, section in reports.sections(stdout).items():
        kind, rank, fate = ([*name.split(maxsplit=2), "", ""])[:3]
        if kind == "stack" and rank.isdigit():
            stacks[int(rank)] = tuple(section.output.splitlines())
            fates[int(rank)] = fate
        elif kind == "spy" and rank.isdigit() and section.exit_code == 0:
            spied[int(rank)] = tuple(section.output.splitlines())
    return StopResult(node, count, how, pids, stacks=stacks, stack_fates=fates,
                      spied=spied)


def elsewhere(inventory: Inventory, record: JobRecord,
              nodes: Sequence[str] | None = None) -> dict[str, str]:
    """The job's nodes this inventory cannot ask about it, each with why: the cluster
    shrank, or another inventory names another machine so (two clusters' inventories side
    by side share .gpucluster/, and so the job records). Asking that machine would find
    no trace of the job and call it gone while it runs on. The inventory the job was
    started with, edited since (a node re-addressed), is taken at its word."""
    listed = {h.name: h for h in inventory.hosts}
    other_file = bool(record.inventory) and record.inventory != str(inventory.path.resolve())
    why = {}
    for node in (list(nodes) if nodes is not None else record.hosts):
        host, then = listed.get(node), record.endpoints.get(node)
        if host is None:
            why[node] = f"{inventory.path.name} does not list {node}"
        elif other_file and then is not None and host.endpoint != then:
            why[node] = f"{node} ran it at {then}, {inventory.path.name} has it at {host.endpoint}"
    return why


def hosts_of(inventory: Inventory, record: JobRecord,
             nodes: Sequence[str] | None = None) -> list[Host]:
    """The job's hosts as the inventory knows them now (one it cannot ask is an error)."""
    wanted = list(nodes) if nodes is not None else record.hosts
    away = elsewhere(inventory, record, wanted)
    if away:
        raise GpuclusterError(f"job {record.id} cannot be reached through this inventory: "
                              f"{'; '.join(away.values())} (fix: {record.started_with()})")
    return [inventory.host(n) for n in wanted]


def listing(session: Session, inventory: Inventory, store: JobStore, newest: int
            ) -> tuple[list[JobRecord], dict[str, dict[str, NodeState]]]:
    """`jobs`' list, oldest first, with each job's state: the `newest` jobs, and any
    older one with processes still on a node, which would otherwise drop off the list
    behind newer jobs while it trains for days (nothing but `top` showed it then). The
    older ones are asked in the same round trip, and only until they are seen ended
    (`_note_ended`) or a final copy of their log here says how they ended."""
    records = store.records()
    if not records:
        return [], {}
    cut = max(0, len(records) - newest)
    older = _not_seen_ended(store, records[:cut])
    table = states(session, inventory, older + records[cut:], copies=store)
    _note_ended(store, older, table)
    shown = [r for r in older if _present(table[r.id])] + records[cut:]
    return shown, {r.id: table[r.id] for r in shown}


def running_besides(session: Session, inventory: Inventory, store: JobStore, job_id: str
                    ) -> dict[str, list[str]]:
    """The other recorded jobs with processes still on a node: id -> those nodes."""
    others = _not_seen_ended(store, [r for r in store.records() if r.id != job_id])
    table = states(session, inventory, others, copies=store) if others else {}
    _note_ended(store, others, table)
    return {r.id: nodes for r in others if (nodes := _present(table[r.id]))}


def _not_seen_ended(store: JobStore, records: Sequence[JobRecord]) -> list[JobRecord]:
    return [r for r in records if not store.seen_ended(r.id)]


def _present(found: dict[str, NodeState]) -> list[str]:
    return [node for node, state in found.items() if state.state in PRESENT]


def _note_ended(store: JobStore, records: Sequence[JobRecord],
                table: dict[str, dict[str, NodeState]]) -> None:
    """Marks each job whose leader has ended on every node asked (exited or stopped; not
    `missing` or `lost`, which a job still starting reads for a moment): a job never
    runs again, so its nodes need not be asked whether it does, whichever node is down
    since. Else an old `launch -d` never followed was asked on every `jobs`."""
    for record in records:
        found = table[record.id].values()
        if found and all(s.state in ("exited", "stopped") for s in found):
            store.note_seen_ended(record.id)


def states(session: Session, inventory: Inventory, records: Sequence[JobRecord],
           copies: JobStore | None = None) -> dict[str, dict[str, NodeState]]:
    """job id -> node -> state, one round trip per node for all jobs. With `copies`, a
    node whose copy there of a job's log is final is not asked about it: the state it
    gave then is the job's there for good (a node down since is no news of the job)."""
    from gpucluster.launch import ended_copies

    table: dict[str, dict[str, NodeState]] = {r.id: {} for r in records}
    # A node this inventory cannot ask about a job gets no state: "not in this inventory".
    askable = {r.id: set(r.hosts) - set(elsewhere(inventory, r)) for r in records}
    if copies is not None:
        for record in records:
            ended = ended_copies.recorded(copies, record, askable[record.id], whole=False)
            table[record.id].update(ended)
            askable[record.id] -= set(ended)
    names = sorted(set().union(*askable.values()))
    by_node = {n: [r for r in records if n in askable[r.id]] for n in names}
    jobs_dirs = {r.jobs_dir for r in records}

    def ask(connection: Connection) -> dict[str, list[str]]:
        lines: dict[str, list[str]] = {"job": [], "peer-left": [], "quiet": []}
        for jobs_dir in sorted(jobs_dirs):
            mine = [r for r in by_node[connection.host] if r.jobs_dir == jobs_dir]
            if mine:
                output = connection.run(node_scripts.state_script(mine, connection.host,
                                                                  jobs_dir), timeout=30)
                said = reports.by_kind(output.stdout)
                for kind, kept in lines.items():
                    kept.extend(said.get(kind, []))
        return lines

    answers = session.map([inventory.host(n) for n in names], ask)
    for node, lines in answers.values.items():
        quiet = {job_id: max(0, int(seconds)) for job_id, _, seconds in
                 (line.partition(" ") for line in lines["quiet"])
                 if seconds.lstrip("-").isdigit()}  # "JOB SECONDS"
        for line in lines["job"]:
            job_id, _, rest = line.partition(" ")
            if job_id in table:
                table[job_id][node] = dataclasses.replace(parse_state(node, rest),
                                                          quiet_s=quiet.get(job_id))
        for line in lines["peer-left"]:  # "JOB PEER WHY (gpucluster stop JOB ends it there)"
            job_id, peer, why = [*line.split(" ", 2), "", ""][:3]
            if node in table.get(job_id, {}):
                state = table[job_id][node]
                why = _STOP_HINT.sub("", why) or "no answer"
                table[job_id][node] = dataclasses.replace(
                    state, peers_left=(*state.peers_left, (peer, why)))
    for node, failure in answers.failures.items():
        for record in records:
            if node in askable[record.id]:
                table[record.id][node] = NodeState(node, "unreachable", None, failure.message)
    return {r.id: {n: table[r.id][n] for n in r.hosts if n in table[r.id]}  # the job's order
            for r in records}
