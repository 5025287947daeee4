"""launch's word on Slurm's queue: from the rider's sections, which nodes Slurm could
start jobs on while a launched job runs outside its queue."""

from __future__ import annotations

from gpucluster import reports
from gpucluster.launch import outside_slurm
from gpucluster.wording import WARNING

NODES = ["node1", "node2", "node3"]


def sections(listing: str, nodes: list[str] = NODES) -> dict[str, dict[str, reports.Section]]:
    """Each node's rider output, as the preflight's report parser reads it."""
    text = f"{reports.MARK} section {outside_slurm.SECTION}\n{listing}\n\n{reports.MARK} end 0\n"
    return {n: reports.sections(text) for n in nodes}


def test_no_word_where_slurm_is_not_set_up_or_holds_every_node_back() -> None:
    assert outside_slurm.warning(sections(outside_slurm.NOT_SET_UP), NODES, "t.py", []) is None
    held = "node1|drained|maintenance\nnode2|down*|Not responding\nnode3|idle+drain|x"
    assert outside_slurm.warning(sections(held), NODES, "t.py", []) is None
    assert outside_slurm.warning({}, NODES, "t.py", []) is None  # an older node: no section


def test_the_nodes_slurm_could_use_are_named_with_its_jobs_and_both_ways_out() -> None:
    listing = "node1|idle|none\nnode2|mixed|none\nnode3|drained|bad GPU 3"
    said = outside_slurm.warning(sections(listing), NODES, "train.py", ["--lr", "1e-3 x"])
    assert said is not None and said.startswith(WARNING)
    assert said.startswith(f"{WARNING}node[1-2] in Slurm's queue"), said
    assert "; it has jobs on node2 now" in said
    assert "gpucluster export sbatch --submit [options] train.py -- --lr '1e-3 x'" in said
    assert "scontrol update nodename=node[1-2] state=drain reason=gpucluster" in said
    # Only the launch's own nodes count.
    said = outside_slurm.warning(sections(listing), ["node1"], "train.py", [])
    assert said is not None and "node2" not in said and "it has jobs" not in said


def test_a_silent_slurmctld_counts_as_open_and_says_so() -> None:
    failed = "slurm_load_partitions: Unable to contact slurm controller (connect failure)"
    said = outside_slurm.warning(sections(failed), NODES, "t.py", [])
    assert said is not None and "sinfo did not answer about node[1-3]" in said
    # The rider's limit keeps a dead slurmctld's retries out of the start.
    assert f"timeout {outside_slurm.SINFO_LIMIT_S} sinfo" in outside_slurm.rider()
