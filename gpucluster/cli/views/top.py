"""`gpucluster top`: every node's GPUs, their jobs and ranks, and its network, as one
table under a summary line."""

from __future__ import annotations

from rich.console import Group, RenderableType
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from gpucluster.observe.model import GpuProcess
from gpucluster.observe.snapshot import NodeView, Snapshot

_HOT_C = 85  # a GPU temperature worth a colour


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
        parts.append(f"slowest node: {summary.slowest[0]} ({summary.slowest[1]:.0f}% GPU)")
    if summary.busiest:
        host, interface, total = summary.busiest
        parts.append(f"busiest link: {host} {interface} {rate(total)}")
    if summary.idle_in_jobs:
        idle = ", ".join(f"{h} GPU {g} ({j})" for h, g, j in summary.idle_in_jobs[:4])
        more = len(summary.idle_in_jobs) - 4
        parts.append(f"idle GPUs of running jobs: {idle}" + (f" +{more}" if more > 0 else ""))
    stale = [n.host for n in snapshot.nodes if n.stale]
    if stale:
        parts.append(f"stale: {', '.join(stale)}")
    return Text(" | ".join(parts), style="bold")


def _who(processes: list[GpuProcess]) -> str:
    if not processes:
        return ""
    shown = []
    for p in processes[:3]:
        if p.job:
            shown.append(f"{p.job} rank {p.rank if p.rank is not None else '?'}")
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
    rx, tx = sample.rates.get(sample.interface or "", (None, None))
    ib = "".join(f"  {escape(name)} rx {rate(r)} tx {rate(t)}"
                 for name, (r, t) in sample.rates.items() if "/" in name)
    load = f"load {sample.load1:.1f}/{sample.cpus}" if sample.load1 is not None else ""
    error = f"  [red]{escape(sample.error)}[/]" if sample.error else ""
    return (f"[bold]{escape(node.host)}[/]  {escape(sample.interface or '-')} rx {rate(rx)} "
            f"tx {rate(tx)}{ib}  {load}{error}")


# Fixed widths, so that every node's table lines up under the others.
_COLUMNS = (("GPU", 5), ("util", 5), ("memory", 11), ("temp", 5), ("power", 6),
            ("ECC/Xid", 7), ("job / rank", 30))


def _gpu_table(node: NodeView) -> Table:
    table = Table(box=None, pad_edge=False, show_header=False)
    for name, width in _COLUMNS:
        table.add_column(name, min_width=width, justify="left" if name == "job / rank"
                         else "right")
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
            f"{node.new_ecc(gpu) or 0}/{xid}", escape(_who(sample.processes_on(gpu))),
            style="dim" if node.stale else "")
    return table


def render(snapshot: Snapshot) -> RenderableType:
    header = Table(box=None, pad_edge=False)
    for name, width in _COLUMNS:
        header.add_column(name, min_width=width, justify="left" if name == "job / rank"
                          else "right")
    parts: list[RenderableType] = [summary_line(snapshot), header]
    for node in snapshot.nodes:
        parts.append(Text.from_markup(_node_line(node)))
        if node.sample is not None and node.sample.gpus:
            parts.append(_gpu_table(node))
    return Group(*parts)
