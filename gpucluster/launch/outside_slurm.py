"""A launched job runs beside Slurm's queue, not in it: where Slurm is set up on the nodes
(provision --with slurm, or a site's own), Slurm may start its jobs on the same GPUs while
ours runs. Launch says so before it starts, from a short sinfo riding along with its
preflight round trip, unless Slurm already holds those nodes back (drained or down)."""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence

from gpucluster import hostrange, reports
from gpucluster.reports import Section
from gpucluster.slurm_states import (
    NOT_SET_UP,
    SINFO,
    base_state,
    is_healthy,
    parse_sinfo,
    where_set_up,
)
from gpucluster.wording import WARNING

SECTION = "slurm-queue"
# A healthy slurmctld answers in milliseconds; a dead one makes sinfo retry for about
# 10 s, which the start must not wait: past this, Slurm's view is unknown.
SINFO_LIMIT_S = 2
BUSY = ("allocated", "mixed", "completing")


def rider() -> str:
    """Shell code for the preflight round trip: one report section, Slurm's node list
    where it is set up on this node, `not set up` elsewhere."""
    return (f"echo {shlex.quote(reports.MARK + ' section ' + SECTION)}\n"
            f"{where_set_up(f'timeout {SINFO_LIMIT_S} {SINFO} 2>&1')}\n"
            f"echo; echo {shlex.quote(reports.MARK + ' end 0')}\n")


def warning(sections: Mapping[str, Mapping[str, Section]], nodes: Sequence[str],
            script: str, args: Sequence[str]) -> str | None:
    """What to tell the user when Slurm could start a job on any of `nodes`: those it has
    open (or cannot say), with any it is running jobs on now, and the two ways out."""
    listings = {n: sections[n][SECTION].output.strip() for n in nodes
                if n in sections and SECTION in sections[n]}
    under = [n for n, text in listings.items() if text != NOT_SET_UP]
    if not under:
        return None
    states = next((parsed for n in under if (parsed := parse_sinfo(listings[n]))), {})
    open_nodes = [n for n in under if n not in states or is_healthy(states[n][0])]
    if not open_nodes:
        return None  # drained or down in Slurm: it starts nothing there
    busy = [n for n in open_nodes if n in states and base_state(states[n][0]) in BUSY]
    unknown = [n for n in open_nodes if n not in states]
    queued = shlex.join([script, "--", *args] if args else [script])
    return (f"{WARNING}{hostrange.fold(open_nodes)} in Slurm's queue: Slurm may start its "
            f"jobs on the GPUs this job uses outside it"
            + (f"; it has jobs on {hostrange.fold(busy)} now" if busy else "")
            + (f"; sinfo did not answer about {hostrange.fold(unknown)}" if unknown else "")
            + f" (fix: queue this job instead: gpucluster export sbatch --submit [options] "
              f"{queued}; or hold Slurm off the nodes first: sudo scontrol update "
              f"nodename={hostrange.fold(open_nodes)} state=drain reason=gpucluster, and "
              f"state=resume after)")
