"""An ended job's nodes read from the controller's copies: a copy made final (whole,
after the job had ended on its node) keeps the node's own words for how the job ended
there, so neither its log nor its state is fetched again; the node may be down, or
re-imaged, since."""

from __future__ import annotations

from collections.abc import Iterable

from gpucluster.launch.jobs import JobRecord, JobStore
from gpucluster.launch.log_copy import ending
from gpucluster.launch.logsearch import LogFilter, LogLine, merged
from gpucluster.launch.model import NodeState, OutputCallback, OutputClosed, parse_state


def recorded(store: JobStore, record: JobRecord, nodes: Iterable[str],
             whole: bool) -> dict[str, NodeState]:
    """Those of `nodes` whose copy is final, with the state their node gave it. `whole`:
    only copies that hold every line of their log (to be printed, not searched)."""
    states = {}
    for node in nodes:
        end = ending(store.node_log(record.id, node))
        if end is not None and (end.whole or not whole):
            states[node] = parse_state(node, end.state)
    return states


def lines(store: JobStore, record: JobRecord, nodes: Iterable[str],
          last: int | None = None) -> list[LogLine]:
    """The lines of these nodes' copies in time order (only the `last` of them)."""
    return merged(store, [record], LogFilter(nodes=frozenset(nodes)), last)


def replay(store: JobStore, record: JobRecord, nodes: Iterable[str],
           on_output: OutputCallback) -> bool:
    """The lines of these nodes' copies to `on_output`, in time order, as a follow of
    their logs would give them; False when the output's reader went away."""
    try:
        hand_on(lines(store, record, nodes), on_output)
    except OutputClosed:
        return False
    return True


def hand_on(found: Iterable[LogLine], on_output: OutputCallback) -> None:
    """Lines read here to `on_output`, as a node's follower hands on those it gets."""
    for line in found:
        on_output(line.node, None if line.rank is None else str(line.rank), line.text)
