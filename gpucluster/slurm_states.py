"""Slurm's word on its nodes (sinfo): parsed and judged. A leaf module, so that doctor
and bundle can read Slurm's states without importing the Slurm step and its export."""

from __future__ import annotations

HEALTHY = ("idle", "allocated", "mixed", "completing")
# A job's states (squeue %T, scontrol JobState) once it has ended for good; every other
# state (pending, running, held, requeued, or one a newer Slurm adds) is a job Slurm still
# has, whose processes are never ours to end. templates/observe/node_gpus.py keeps a copy
# (it runs on nodes alone); a unit test keeps the two equal.
ENDED_JOB_STATES = ("BOOT_FAIL", "CANCELLED", "COMPLETED", "DEADLINE", "FAILED", "NODE_FAIL",
                    "OUT_OF_MEMORY", "PREEMPTED", "REVOKED", "TIMEOUT")
# The format parse_sinfo reads.
SINFO = "sinfo -h -N -o '%N|%T|%E'"
# provision --with slurm's epilog on every node; a site's own Slurm has slurm.conf.
EPILOG = "/etc/slurm/gpucluster-epilog.sh"
SLURM_CONF = "/etc/slurm/slurm.conf"
# A shell test: is Slurm set up on this node (ours, or a site's)?
SET_UP_HERE = f"[ -e {EPILOG} ] || [ -e {SLURM_CONF} ]"
NOT_SET_UP = "not set up"  # what where_set_up prints on a node without Slurm


def where_set_up(command: str) -> str:
    """Shell: `command` where Slurm is set up on the node, else NOT_SET_UP printed."""
    return f"if {SET_UP_HERE}; then {command}; else echo '{NOT_SET_UP}'; fi"


def parse_sinfo(output: str) -> dict[str, tuple[str, str]]:
    """`sinfo -N -o '%N|%T|%E'` -> node -> (state, reason)."""
    states = {}
    for line in output.splitlines():
        parts = line.strip().split("|", 2)
        if len(parts) == 3:
            states[parts[0]] = (parts[1].strip().lower(), parts[2].strip())
    return states


def base_state(state: str) -> str:
    """The state without sinfo's flag suffix ("mixed+" -> "mixed", "down*" -> "down")."""
    return state.rstrip("*+~#!%$@^-")


def is_healthy(state: str) -> bool:
    """Up and usable: idle or running jobs; `*` (not responding), drain, down, inval
    or unknown are not."""
    return "*" not in state and base_state(state) in HEALTHY and "drain" not in state


def problem_of(state: str, reason: str) -> str:
    """What is wrong with a node, naming the fields where its facts and slurm.conf
    differ (Slurm's reason: "Low RealMemory (reported:1000 < 100.00% of configured:2000)")."""
    text = f"Slurm has it {state}" + (" (its slurmd is not responding)"
                                      if state.endswith("*") else "") \
        + (f": {reason}" if reason and reason != "none" else "")
    if "reported" in reason or "Low " in reason or "count" in reason:
        text += (" (the node's facts differ from slurm.conf: rerun provision to rebuild it "
                 "from what the nodes report now)")
    return text
