"""`gpucluster top`: every node's GPUs, their jobs and ranks, and its network, as one
table under a summary line."""

from __future__ import annotations

from rich.console import Console, Group, RenderableType
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from gpucluster import clock_events, hostrange
from gpucluster.hostrange import spans
from gpucluster.observe.model import GpuProcess, NodeSample
from gpucluster.observe.slowest import Slowest
from gpucluster.observe.slurm_queue import QueueReading
from gpucluster.observe.snapshot import NodeView, Snapshot
from gpucluster.quiet import quiet_words
from gpucluster.wording import ranks_named

_HOT_C = 85  # a GPU temperature worth a colour
_BARS = "▁▂▃▄▅▆▇█"  # a GPU's utilisation in one character, for a line per node


def rate(bytes_per_s: int | None) -> str:
    if bytes_per_s is None:
        return "-"
    bits = bytes_per_s * 8
    for unit, size in (("Gb/s", 1e9), ("Mb/s", 1e6), ("kb/s", 1e3)):
        if bits >= size:
            return f"{bits / size:.1f} {unit}"
    return f"{bits:.0f} b/s"


def summary_line(snapshot: Snapshot) -> Text:
    summary = snapshot.summary
    busy, sampled = summary.busy_gpus
    # Always first: on one node, or before the rates of a second frame, it may be alone.
    parts = [f"{busy}/{sampled} GPUs busy" if sampled else "no GPUs sampled"]
    if summary.slowest:
        parts.append(_slowest_part(summary.slowest))
    if summary.busiest:
        host, interface, total = summary.busiest
        parts.append(f"busiest link: {host} {interface} {rate(total)}")
    if summary.idle_in_jobs:
        idle = ", ".join(f"{h} GPU {g} ({j})" for h, g, j in summary.idle_in_jobs[:4])
        more = len(summary.idle_in_jobs) - 4
        parts.append(f"idle GPUs of running jobs: {idle}" + (f" +{more}" if more > 0 else ""))
    parts.extend(_slowed_parts(summary.slowed))
    for job, seconds in summary.quiet[:2]:  # a hang (NCCL keeps its GPUs busy meanwhile)
        parts.append(f"job {_short_job(job)} {quiet_words(seconds)}")
    if snapshot.slurm is not None:
        parts.append(_slurm_part(snapshot.slurm))
    stale = [n.host for n in snapshot.nodes if n.stale]
    if stale:
        parts.append(f"stale: {', '.join(stale)}")
    blind = [n.host for n in snapshot.nodes
             if not n.stale and n.sample is not None and n.sample.xid is None]
    if blind:  # else every GPU's `?` goes unexplained
        parts.append(f"Xid ?: {hostrange.fold(blind)} cannot read the kernel log (fix: "
                     f"--ask-sudo-pass where sudo asks a password, passwordless sudo, or "
                     f"sysctl kernel.dmesg_restrict=0)")
    return Text(" | ".join(parts), style="bold")


def _slowest_part(slowest: tuple[Slowest, ...]) -> str:
    """`slowest node: node3 (12% GPU)`; with several jobs, one per job, each named as
    the narrow view names it: `slowest nodes: node4 (10% GPU, 82e9), node2 (15% GPU,
    f511)`."""
    if len(slowest) == 1:
        return f"slowest node: {slowest[0].host} ({slowest[0].util:.0f}% GPU)"
    return "slowest nodes: " + ", ".join(
        f"{s.host} ({s.util:.0f}% GPU, {_short_job(s.job) if s.job else 'foreign'})"
        for s in slowest)


def _short_job(job: str) -> str:
    """A gpucluster job's id by its last part (`bd46`: gpucluster stop takes a unique
    part); `slurm-12` whole."""
    return job if job.startswith("slurm-") else job.rsplit("-", 1)[-1]


def _slowed_parts(slowed: tuple[tuple[str, int, tuple[str, ...]], ...]) -> list[str]:
    """`clocks held down: node3 GPU 0-7 hw_thermal (too hot: ...)`, a part per reason."""
    by_reason: dict[tuple[str, ...], dict[str, list[int]]] = {}
    for host, gpu, reasons in slowed:
        by_reason.setdefault(reasons, {}).setdefault(host, []).append(gpu)
    parts = []
    for reasons, hosts in by_reason.items():
        where = ", ".join(f"{host} GPU {spans(sorted(gpus))}" for host, gpus in hosts.items())
        remedy = clock_events.REMEDIES.get(reasons[0], "")
        parts.append(f"clocks held down: {where} {'+'.join(reasons)}"
                     + (f" ({remedy})" if remedy else ""))
    return parts


def _slurm_part(reading: QueueReading) -> str:
    """`Slurm: 2 running, 1 pending` (then any other state), or why the queue is unknown."""
    if reading.error:
        return f"Slurm: {reading.error}"
    return "Slurm: " + ", ".join(f"{count} {state.lower()}" for state, count in sorted(
        reading.by_state().items(), key=lambda item: (item[0] != "RUNNING", item[0])))


def _who(processes: list[GpuProcess]) -> str:
    if not processes:
        return ""
    shown = []
    for p in processes[:3]:
        if p.job:
            shown.append(f"{p.job} rank {p.rank if p.rank is not None else '?'}")
        elif p.slurm_job:
            # slurm-12: the name logs, stop and bundle take; its rank where torchrun
            # (export sbatch's) gave one, the user since the queue is shared
            held = f"rank {p.rank}" if p.rank is not None else f"pid {p.pid}"
            shown.append(f"slurm-{p.slurm_job} {held} ({p.user})")
        else:
            shown.append(f"foreign pid {p.pid} ({p.user})")
    return ", ".join(shown) + (f" +{len(processes) - 3}" if len(processes) > 3 else "")


def _node_line(node: NodeView) -> str:
    sample = node.sample
    if node.stale:
        age = f"stale {node.age_s:.0f}s" if node.age_s is not None else "no data"
        return f"[bold red]{escape(node.host)}[/] {age}" + (
            f": {escape(node.error)}" if node.error else "")
    assert sample is not None
    error = f"  [red]{escape(sample.error)}[/]" if sample.error else ""
    return f"[bold]{escape(node.host)}[/]  {escape(_traffic(sample))}{error}"


def _traffic(sample: NodeSample) -> str:
    """`eth0 rx 1.2 Mb/s tx 1.4 Mb/s  mlx5_0/1 rx ... tx ...  load 1.9/16`."""
    rx, tx = sample.rates.get(sample.interface or "", (None, None))
    ib = "".join(f"  {name} rx {rate(r)} tx {rate(t)}"
                 for name, (r, t) in sample.rates.items() if "/" in name)
    load = f"load {sample.load1:.1f}/{sample.cpus}" if sample.load1 is not None else ""
    return f"{sample.interface or '-'} rx {rate(rx)} tx {rate(tx)}{ib}  {load}"


# Fixed widths, so that every node's table lines up under the others.
_COLUMNS = (("GPU", 5), ("util", 5), ("memory", 11), ("temp", 5), ("power", 6),
            ("ECC/Xid", 7), ("job / rank", 30))


def _columns(table: Table, screen_width: int | None) -> Table:
    """The per-GPU columns; on a screen narrower than they are, the job column (the
    last) takes what is left and ends in '…', so that a GPU's line never wraps."""
    figures = sum(width for _, width in _COLUMNS[:-1]) + 2 * (len(_COLUMNS) - 1)
    name, jobs = _COLUMNS[-1]
    room = None if screen_width is None else max(len(name), screen_width - figures)
    for column, width in _COLUMNS[:-1]:
        table.add_column(column, min_width=width, justify="right")
    table.add_column(name, min_width=jobs if room is None else min(jobs, room),
                     max_width=room, no_wrap=True, overflow="ellipsis")
    return table


def _gpu_table(node: NodeView, screen_width: int | None) -> Table:
    table = _columns(Table(box=None, pad_edge=False, show_header=False), screen_width)
    sample = node.sample
    assert sample is not None
    for gpu in sample.gpus:
        memory = (f"{(gpu.mem_used or 0) / 1024:.1f}/{(gpu.mem_total or 0) / 1024:.0f}G"
                  if gpu.mem_total else "-")
        hot = "red" if gpu.temp is not None and gpu.temp >= _HOT_C else ""
        xid = str(len(sample.xid_on(gpu))) if sample.xid is not None else "?"
        table.add_row(
            f"  {gpu.index}", f"{gpu.util}%" if gpu.util is not None else "-", memory,
            Text(f"{gpu.temp}C" if gpu.temp is not None else "-", style=hot),
            f"{gpu.power:.0f}W" if gpu.power is not None else "-",
            f"{_count(node.new_ecc(gpu))}/{xid}", escape(_who(sample.processes_on(gpu))),
            style="dim" if node.stale else "")
    return table


def _count(errors: int | None) -> str:
    """An ECC count, "-" where the GPU keeps none (a GeForce, ECC off): not "0"."""
    return "-" if errors is None else str(errors)


def _node_jobs(processes: tuple[GpuProcess, ...], short: bool = False) -> str:
    """`20261202-112253-bd46 ranks 0-7, slurm 12, foreign 2`; `short`: `bd46 ranks 0-7,
    ...` (the id's last part names the job as well: gpucluster stop takes a unique part)."""
    ranks: dict[str, set[int]] = {}  # gpucluster's jobs, then Slurm's (slurm-12)
    foreign = 0
    for process in sorted(processes, key=lambda p: p.job is None):
        job = process.job or (f"slurm-{process.slurm_job}" if process.slurm_job else None)
        if job is None:
            foreign += 1
        else:
            ranks.setdefault(job, set()).update(
                [process.rank] if process.rank is not None else [])
    names = {job: _short_job(job) if short else job for job in ranks}
    parts = [f"{names[job]} {ranks_named(held)}"
             if held else names[job] for job, held in ranks.items()]
    return ", ".join(parts + ([f"foreign {foreign}"] if foreign else []))


def _compact_row(node: NodeView) -> list[str | Text]:
    sample = node.sample
    if node.stale or sample is None:
        return [Text.from_markup(_node_line(node))]
    gpus = sample.gpus
    utils = [g.util for g in gpus]
    known = [u for u in utils if u is not None]
    bars = "".join(" " if u is None else _BARS[round(min(max(u, 0), 100) / 100 * 7)]
                   for u in utils)
    used = sum(g.mem_used or 0 for g in gpus) / 1024
    total = sum(g.mem_total or 0 for g in gpus) / 1024
    temps = [g.temp for g in gpus if g.temp is not None]
    power = sum(g.power or 0 for g in gpus)
    counted = [ecc for g in gpus if (ecc := node.new_ecc(g)) is not None]
    xid = str(len(sample.xid)) if sample.xid is not None else "?"
    return [
        Text(node.host, style="bold"),
        f"{bars} {sum(known) / len(known):.0f}%" if known else "-",
        f"{used:.1f}/{total:.0f}G" if gpus else "-",
        Text(f"{max(temps)}C", style="red" if max(temps) >= _HOT_C else "") if temps else "-",
        f"{power:.0f}W" if gpus else "-",
        f"{_count(sum(counted) if counted else None)}/{xid}" if gpus else "-",
        _jobs_cell(sample),
        _traffic(sample),
    ]


def _jobs_cell(sample: NodeSample, short: bool = False) -> str:
    """The node's jobs; for a node without GPU figures (no driver, nvidia-smi failing),
    why: in the util column, the error took every other column's room."""
    if sample.error and all(g.util is None for g in sample.gpus):
        return sample.error
    return _node_jobs(sample.processes, short)


_COMPACT_COLUMNS = ("node", "util", "memory", "temp", "power", "ECC/Xid", "jobs", "link")


def _compact(snapshot: Snapshot, width: int | None) -> RenderableType:
    """One line per node: each GPU's utilisation as a bar and their mean, memory and
    power summed, the hottest GPU, ECC/Xid summed, the jobs' ranks, the link."""
    rows = [_compact_row(node) for node in snapshot.nodes]
    widths = [max([len(name), *(len(str(r[column])) for r in rows if len(r) > 1)])
              for column, name in enumerate(_COMPACT_COLUMNS)]
    if width is not None:  # one line per node: a narrow terminal cuts the jobs and the
        # link short (the jobs up to two thirds of the room), never the figures
        room = max(8, width - sum(widths[:6]) - 2 * (len(widths) - 1))
        jobs, link = widths[6:]
        if jobs + link > room:
            for row, node in zip(rows, snapshot.nodes, strict=True):
                if len(row) > 1 and node.sample is not None:  # the ids' last part only
                    row[6] = _jobs_cell(node.sample, short=True)
            jobs = max([len(_COMPACT_COLUMNS[6]), *(len(str(r[6])) for r in rows
                                                     if len(r) > 1)])
            link = max(4, min(link, max(room // 3, room - jobs)))
            widths[6:] = [max(4, room - link), link]
    table = Table(box=None, pad_edge=False)
    for name, column_width in zip(_COMPACT_COLUMNS, widths, strict=True):
        table.add_column(name, no_wrap=True, overflow="ellipsis", width=column_width,
                         justify="right" if name in ("memory", "temp", "power", "ECC/Xid")
                         else "left")
    stale = []
    for row in rows:
        if len(row) == 1:  # a stale node's own line, as in the view per GPU
            stale.append(row[0])
        else:
            table.add_row(*row)
    return Group(summary_line(snapshot), table, *stale)


def render(snapshot: Snapshot, screen: Console | None = None, compact: bool = False,
           fit: bool = False) -> RenderableType:
    """A line per GPU under a line per node; a line per node (`_compact`, as wide as
    `screen`) when asked, or with `fit` when a line per GPU would not fit on `screen`."""
    if compact:
        return _compact(snapshot, screen.width if screen is not None else None)
    full = _per_gpu(snapshot, screen.width if screen is not None else None)
    if fit and screen is not None and \
            len(screen.render_lines(full, screen.options, pad=False)) > screen.height:
        return _compact(snapshot, screen.width)
    return full


def _per_gpu(snapshot: Snapshot, screen_width: int | None) -> RenderableType:
    header = _columns(Table(box=None, pad_edge=False), screen_width)
    parts: list[RenderableType] = [summary_line(snapshot), header]
    for node in snapshot.nodes:
        parts.append(Text.from_markup(_node_line(node)))
        if node.sample is not None and node.sample.gpus:
            parts.append(_gpu_table(node, screen_width))
    return Group(*parts)
