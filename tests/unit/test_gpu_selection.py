"""A job on some of each node's GPUs (launch --gpus, CUDA_VISIBLE_DEVICES): the list
parsed, and the checks before its start judging those GPUs alone."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from gpucluster import inventory as inventory_module
from gpucluster.doctor import gpu_selection
from gpucluster.doctor.model import REGISTRY, Context, Status
from gpucluster.doctor.probe import NodeFacts
from gpucluster.errors import GpuclusterError
from gpucluster.launch.request import gpus_found, job_inventory
from gpucluster.nproc import GpuCount, check_fit, nproc_for
from tests.unit.test_doctor_checks import facts, gpu_row

APPS_HEADER = "gpu_bus_id, pid, process_name, used_gpu_memory [MiB]"


def context(tmp_path: Path, node_facts: dict[str, NodeFacts]) -> Context:
    """Nodes the inventory gives 4 GPUs each."""
    path = tmp_path / "inventory.yaml"
    path.write_text(f"defaults:\n  gpus: 4\nhosts: [{', '.join(node_facts)}]\n")
    return Context(inventory_module.load(path), node_facts, {}, {})


def test_the_option_is_cuda_visible_devices_value() -> None:
    assert gpu_selection.parse_option("4-7") == "4,5,6,7"
    assert gpu_selection.parse_option("0, 2,5-6") == "0,2,5,6"
    assert gpu_selection.parse_option("3") == "3"


@pytest.mark.parametrize(("text", "said"), [
    ("a", "expected GPU indices from 0"), ("3-1", "expected GPU indices from 0"),
    ("²", "expected GPU indices from 0"), ("0-3,2", "GPU 2 listed twice"),
    ("0-99999", "no node has GPU 99999"), ("", "expected GPU indices")])
def test_a_bad_list_is_one_line_with_the_fix(text: str, said: str) -> None:
    with pytest.raises(GpuclusterError, match="fix:") as raised:
        gpu_selection.parse_option(text)
    assert said in str(raised.value)


def test_the_selection_is_read_from_the_jobs_environment() -> None:
    assert gpu_selection.from_env({}) is None
    chosen = gpu_selection.from_env({"CUDA_VISIBLE_DEVICES": "4,5,6,7"})
    assert chosen is not None and str(chosen) == "GPU 4-7"
    by_uuid = gpu_selection.from_env({"CUDA_VISIBLE_DEVICES": "GPU-1, 3"})
    assert by_uuid is not None and by_uuid.entries == ("GPU-1", "3")
    assert str(by_uuid) == "GPUs GPU-1,3"
    assert gpu_selection.from_env({"CUDA_VISIBLE_DEVICES": ""}) == \
        gpu_selection.GpuSelection(())
    # A MIG device's UUID: not a whole GPU the checks could judge; the whole node is.
    assert gpu_selection.from_env({"CUDA_VISIBLE_DEVICES": "MIG-4f2a"}) is None


def test_a_process_on_a_gpu_the_job_leaves_out_does_not_refuse_it(tmp_path: Path) -> None:
    apps = f"{APPS_HEADER}\n00000000:18:00.0, 4242, python serve.py, 30000 MiB"
    node = facts([gpu_row(i) for i in range(4)], apps=apps)
    ctx = context(tmp_path, {"a": node})
    [every] = REGISTRY["gpu-processes"].run(ctx)
    assert every.status is Status.FAIL and "pid 4242 python serve.py" in every.message
    assert every.remedy.endswith("; or start it on the GPUs free here: launch --gpus 1-3")
    chosen = gpu_selection.from_env({"CUDA_VISIBLE_DEVICES": "1,2,3"})
    [others] = REGISTRY["gpu-processes"].run(dataclasses.replace(ctx, gpus=chosen))
    assert others.status is Status.OK
    assert others.message == "no compute processes on GPU 1-3 (1 process on the others)"
    on_it = gpu_selection.from_env({"CUDA_VISIBLE_DEVICES": "0,1"})
    [held] = REGISTRY["gpu-processes"].run(dataclasses.replace(ctx, gpus=on_it))
    assert held.status is Status.FAIL


def test_a_sick_gpu_the_job_leaves_out_does_not_refuse_it(tmp_path: Path) -> None:
    sick = gpu_row(2, volatile="3")
    ctx = context(tmp_path, {"a": facts([gpu_row(0), gpu_row(1), sick, gpu_row(3)])})
    assert {r.status for r in REGISTRY["ecc"].run(ctx)} == {Status.FAIL}
    around = dataclasses.replace(ctx, gpus=gpu_selection.from_env(
        {"CUDA_VISIBLE_DEVICES": "0,1,3"}))
    assert {r.status for r in REGISTRY["ecc"].run(around)} == {Status.OK}


def test_gpu_count_asks_for_the_jobs_gpus_not_the_inventorys(tmp_path: Path) -> None:
    # GPU 3 fell off the bus: the inventory's 4 are not there, the job's three are.
    ctx = context(tmp_path, {"a": facts([gpu_row(i) for i in range(3)])})
    assert {r.status for r in REGISTRY["gpu-count"].run(ctx)} == {Status.FAIL}
    chosen = dataclasses.replace(ctx, gpus=gpu_selection.from_env(
        {"CUDA_VISIBLE_DEVICES": "0,1,2"}))
    [ok] = REGISTRY["gpu-count"].run(chosen)
    assert ok.status is Status.OK
    assert ok.message == "the job's GPU 0-2 found; nvidia-smi lists 3 GPUs (inventory: 4)"
    past = dataclasses.replace(ctx, gpus=gpu_selection.from_env(
        {"CUDA_VISIBLE_DEVICES": "2,3"}))
    [missing] = REGISTRY["gpu-count"].run(past)
    assert missing.status is Status.FAIL
    assert missing.message == ("GPU 3 not found (the job's: GPU 2-3): nvidia-smi lists "
                               "3 GPUs (inventory: 4)")
    # A UUID as nvidia-smi -L prints it, or its start (CUDA takes either).
    by_uuid = dataclasses.replace(ctx, gpus=gpu_selection.from_env(
        {"CUDA_VISIBLE_DEVICES": "GPU-0,GPU-2"}))
    assert {r.status for r in REGISTRY["gpu-count"].run(by_uuid)} == {Status.OK}
    empty = dataclasses.replace(ctx, gpus=gpu_selection.GpuSelection(()))
    [none] = REGISTRY["gpu-count"].run(empty)
    assert none.status is Status.FAIL and "would see no GPU" in none.message


def test_mig_on_a_gpu_the_job_leaves_out_is_not_counted() -> None:
    node = facts([gpu_row(0, mig="Enabled"), gpu_row(1), gpu_row(2)])
    assert gpus_found({"a": node.sections}) == {"a": GpuCount(3, 1)}
    chosen = gpu_selection.from_env({"CUDA_VISIBLE_DEVICES": "1,2"})
    assert gpus_found({"a": node.sections}, chosen) == {"a": GpuCount(2, 0)}


def test_one_process_per_chosen_gpu_whatever_the_inventory_says(tmp_path: Path) -> None:
    path = tmp_path / "inventory.yaml"
    path.write_text("defaults:\n  gpus: 8\nhosts: [a, b]\n")
    loaded = inventory_module.load(path)
    chosen = {"a": GpuCount(4, 0), "b": GpuCount(4, 0)}
    found = check_fit(loaded, None, chosen, chosen=True)
    assert [nproc_for(h, None, found[h.name], chosen=True) for h in loaded.hosts] == [4, 4]
    assert nproc_for(loaded.hosts[0], None, found["a"]) == 8  # without a choice
    with pytest.raises(GpuclusterError) as raised:
        check_fit(loaded, 6, chosen, chosen=True)
    assert str(raised.value) == (
        "--nproc-per-node 6: a,b have 4 GPUs (the job's: --gpus or CUDA_VISIBLE_DEVICES) "
        "(fix: --nproc-per-node 4 or fewer, one process per GPU, or give the job more GPUs)")


def test_jobs_on_other_gpus_are_apart_and_uuids_against_indices_are_not() -> None:
    ours = gpu_selection.GpuSelection(("4", "5"))
    assert ours.apart_from("0,1") and ours.apart_from("6, 7")
    assert not ours.apart_from("3,4")
    assert not ours.apart_from("GPU-1")  # cannot be told apart: counted as shared
    assert gpu_selection.GpuSelection(("GPU-a",)).apart_from("GPU-b")
    assert (ours.first_index, gpu_selection.GpuSelection(("GPU-a",)).first_index) == (4, None)
    # What the nodes' scripts compare (start.sh, the head's test listener): indices only.
    assert (ours.indices, gpu_selection.GpuSelection(("GPU-a",)).indices) == ("4,5", "")


def test_a_process_is_on_the_chosen_gpus_by_its_index_or_uuid() -> None:
    """reap --gpus: a process's GPU by nvidia-smi's index or UUID, as CUDA reads the
    list; and the option a command on the same GPUs takes."""
    chosen = gpu_selection.from_option("5,0-1")
    assert chosen.entries == ("5", "0", "1") and chosen.option == "--gpus 0-1,5 "
    assert [chosen.holds(i, None) for i in (0, 2, 5, None)] == [True, False, True, False]
    by_uuid = gpu_selection.GpuSelection(("GPU-8932f937",))
    assert by_uuid.holds(None, "GPU-8932f937-a1b2") and not by_uuid.holds(3, "GPU-1234")
    assert by_uuid.option == ""  # reap --gpus takes indices


def test_a_job_on_gpu_k_takes_the_rendezvous_port_k_up(tmp_path: Path) -> None:
    path = tmp_path / "inventory.yaml"
    path.write_text("cluster:\n  rendezvous_ports: 8\nhosts: [a, b]\n")
    loaded = inventory_module.load(path)
    port = job_inventory(loaded, gpu_selection.GpuSelection(("4", "5"))).cluster.rendezvous_port
    assert port == 29504
    assert job_inventory(loaded, None) is loaded
    beyond = gpu_selection.GpuSelection(("9",))  # past rendezvous_ports: the first port
    assert job_inventory(loaded, beyond).cluster.rendezvous_port == 29500
    path.write_text("hosts: [a, b]\n")  # one port, as before: every job on it
    single = inventory_module.load(path)
    assert job_inventory(single, gpu_selection.GpuSelection(("4",))) is single


def test_a_running_job_on_other_gpus_does_not_refuse_one_beside_it(tmp_path: Path) -> None:
    node = facts(jobs="GPUCLUSTER_JOB=j1@a running 0,1\nGPUCLUSTER_JOB=j2@a running -")
    ctx = context(tmp_path, {"a": node})
    [whole] = REGISTRY["jobs"].run(ctx)
    assert whole.status is Status.WARN and whole.message == "job j1, j2 still running"
    assert "--gpus" not in whole.remedy
    only_j1 = context(tmp_path, {"a": facts(jobs="GPUCLUSTER_JOB=j1@a running 0,1")})
    beside = dataclasses.replace(only_j1, gpus=gpu_selection.GpuSelection(("2", "3")))
    [ok] = REGISTRY["jobs"].run(beside)
    assert ok.status is Status.OK
    assert ok.message == "job j1 runs here on GPU 0,1, none of this job's (GPU 2-3)"
    # j2 uses every GPU (none listed); one sharing GPU 1 with j1 is refused too.
    shared = dataclasses.replace(ctx, gpus=gpu_selection.GpuSelection(("1", "2")))
    [refused] = REGISTRY["jobs"].run(shared)
    assert refused.status is Status.WARN and refused.message == "job j1, j2 still running"
    assert refused.remedy.endswith("; or give this job GPUs none of them uses (--gpus)")
