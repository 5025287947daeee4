"""A job that failed while nothing followed it (`launch -d`, or a follow cut short)
had no first failure noted, and `jobs` said only `exited 1: node2`. `jobs` reads it
once from the failed nodes' logs, copying them here on the way as `logs` does (a node
whose copy is final is not asked again), and notes it for every later listing."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from gpucluster.errors import GpuclusterError
from gpucluster.inventory import Inventory
from gpucluster.launch.failure import in_a_line
from gpucluster.launch.follow import follow
from gpucluster.launch.jobs import JobRecord, JobStore
from gpucluster.launch.model import NodeState
from gpucluster.remote.session import Session

# For good: no process of the job left there (lost: it ended unrecorded, the node
# rebooted; missing: the node has no record of it)
ENDED = ("exited", "stopped", "lost", "missing")


def failed_unread(store: JobStore, record: JobRecord, found: Mapping[str, NodeState]) -> bool:
    """Ended on every node it ran on, failed on one, and no failure noted: a node that did
    not answer, or runs on, may still tell another story."""
    return (set(found) == set(record.hosts)
            and all(state.state in ENDED for state in found.values())
            and any(state.failed for state in found.values())
            and store.noted_failure(record.id) is None)


def note_unread(session: Session, inventory: Inventory, store: JobStore,
                records: Sequence[JobRecord],
                table: Mapping[str, Mapping[str, NodeState]]) -> None:
    """Each such job's first failure, as a follow of it would have named it."""
    for record in records:
        found = table.get(record.id, {})
        if not failed_unread(store, record, found):
            continue
        try:
            outcome = follow(session, inventory, record, store, live=False, fail_fast=False,
                             stop_on_interrupt=False,
                             nodes=[node for node, state in found.items() if state.failed])
        except (GpuclusterError, OSError):
            continue  # the listing goes on without it: `logs JOB` says what went wrong
        if outcome.first_failure is not None:
            store.note_failure(record.id, in_a_line(outcome.first_failure))
