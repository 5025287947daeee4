"""Slurm's pieces without nodes: facts as nodes report them, the files built from
them, sinfo's verdicts, the optional step's selection, the firewall's port sets and the
sbatch script. The whole flow runs on sandbox nodes in tests/integration/test_slurm.py."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from gpucluster import inventory, slurm_states
from gpucluster.errors import GpuclusterError
from gpucluster.inventory import SlurmSettings
from gpucluster.provision.runner import select_steps, slurm_settings
from gpucluster.provision.steps_firewall import Firewall, nftables_commands, port_intervals
from gpucluster.provision.steps_slurm import daemons_script
from gpucluster.slurm import config
from gpucluster.slurm.facts import NodeFacts, gpu_type, install_command, missing, parse_facts
from gpucluster.slurm.sbatch import SbatchRequest, sbatch_script
from gpucluster.templating import render

HARDWARE = ("NodeName=gpu01 CPUs=224 Boards=1 SocketsPerBoard=2 CoresPerSocket=56 "
            "ThreadsPerCore=2 RealMemory=2063937")


def node_report(hardware: str = HARDWARE, gpus: int = 8, devices: int = 8,
                nvml: bool = False, commands: str = "slurmd munged munge unmunge") -> str:
    """A facts script's output as a node prints it."""
    def section(name: str, lines: list[str], code: int = 0) -> str:
        return "\n".join([f"@@gpc section {name}", *lines, f"@@gpc end {code}"])
    return "\n".join([
        section("hardware", [hardware]),
        section("commands", commands.split()),
        section("gpus", ["NVIDIA H100 80GB HBM3"] * gpus),
        section("devices", [f"/dev/nvidia{i}" for i in (10, *range(devices - 1))][:devices]),
        section("nvml", ["/usr/lib64/slurm/gpu_nvml.so"] if nvml else []),
        section("systemd", ["yes"]),
        section("packages", ["apt-get"]),
        section("daemons", ["munged"]),
        section("key", ["400 munge munge", "ab" * 32]),
    ])


def test_facts_are_read_from_what_the_node_printed() -> None:
    facts = parse_facts("gpu01", "10.0.0.1", node_report())
    assert facts.node_name == "gpu01" and facts.gpu_count == 8 and facts.systemd
    assert facts.hardware_line == ("CPUs=224 Boards=1 SocketsPerBoard=2 CoresPerSocket=56 "
                                   "ThreadsPerCore=2 RealMemory=2063937")
    assert facts.devices[0] == "/dev/nvidia0" and facts.devices[-1] == "/dev/nvidia10"
    assert facts.gres == "gpu:h100:8" and facts.daemons == {"munged"}
    assert facts.key == f"400 munge munge {'ab' * 32}"
    assert missing(facts, controller=True) == ["slurmctld", "scontrol", "sinfo", "srun",
                                               "sbatch"]
    assert install_command(facts, ["slurmctld", "sinfo", "munged"]) == (
        "DEBIAN_FRONTEND=noninteractive apt-get install -y munge slurm-client slurmctld")


@pytest.mark.parametrize(("name", "kind"), [
    ("NVIDIA H100 80GB HBM3", "h100"), ("NVIDIA A100-SXM4-80GB", "a100"),
    ("Tesla V100-SXM2-32GB", "v100"), ("NVIDIA GeForce RTX 4090", "rtx4090"),
    ("NVIDIA L40S", "l40s"), ("NVIDIA H200", "h200")])
def test_gres_types_come_from_the_gpu_name(name: str, kind: str) -> None:
    assert gpu_type(name) == kind


def _facts(name: str, address: str, **report: object) -> NodeFacts:
    return parse_facts(name, address, node_report(
        HARDWARE.replace("gpu01", name), **report))  # type: ignore[arg-type]


def test_slurm_conf_describes_every_node_from_its_own_facts() -> None:
    nodes = [_facts("gpu01", "10.0.0.1"), _facts("gpu02", "10.0.0.2", gpus=0, devices=0)]
    text = config.slurm_conf("train", SlurmSettings(partition="main"), nodes[0], nodes)
    assert "SlurmctldHost=gpu01(10.0.0.1)\n" in text
    assert "SlurmctldParameters=enable_configless\n" in text
    assert ("NodeName=gpu01 NodeAddr=10.0.0.1 CPUs=224 Boards=1 SocketsPerBoard=2 "
            "CoresPerSocket=56 ThreadsPerCore=2 RealMemory=2063937 Gres=gpu:h100:8 "
            "State=UNKNOWN\n") in text
    assert "NodeName=gpu02 NodeAddr=10.0.0.2 CPUs=224" in text
    assert "gpu02 NodeAddr=10.0.0.2 CPUs=224 Boards=1 SocketsPerBoard=2 CoresPerSocket=56 " \
           "ThreadsPerCore=2 RealMemory=2063937 State" in text  # no Gres without GPUs
    assert "ProctrackType=proctrack/cgroup\nTaskPlugin=task/cgroup,task/affinity" in text
    assert "PartitionName=main Nodes=ALL" in text
    # A dead node is down in a minute (Slurm's own default is 5), its jobs requeued.
    assert "\nSlurmdTimeout=60\n" in text
    assert "\nSlurmdTimeout=20\n" in config.slurm_conf(
        "train", SlurmSettings(node_timeout=20), nodes[0], nodes)
    sandbox = config.slurm_conf("train", SlurmSettings(cgroups=False), nodes[0], nodes)
    assert "ProctrackType=proctrack/linuxproc\nTaskPlugin=task/none" in sandbox


def test_gres_conf_uses_nvml_only_where_slurmd_has_it() -> None:
    nodes = [_facts("gpu01", "10.0.0.1", nvml=True), _facts("gpu02", "10.0.0.2"),
             _facts("cpu01", "10.0.0.3", gpus=0, devices=0)]
    lines = [ln for ln in render("slurm/gres.conf.j2", nodes=nodes).splitlines()
             if not ln.startswith("#")]
    assert lines == ["NodeName=gpu01 AutoDetect=nvml Name=gpu Type=h100",
                     "NodeName=gpu02 Name=gpu Type=h100 File=/dev/nvidia[0-6,10]"]
    assert _facts("gpu03", "10.0.0.4", devices=0).uncountable


def test_only_the_controller_keeps_slurm_conf_and_systemd_nodes_get_the_dropin() -> None:
    ctl, other = _facts("gpu01", "10.0.0.1"), _facts("gpu02", "10.0.0.2")
    paths = [f.path for f in config.files_for("c", SlurmSettings(), other, ctl, [ctl, other])]
    assert paths == [config.EPILOG, config.SLURMD_DROPIN]
    dropin = config.files_for("c", SlurmSettings(), other, ctl, [ctl, other])[1].text
    assert "ExecStart=/usr/sbin/slurmd -D -s --conf-server 10.0.0.1:6817" in dropin
    assert "ConditionPathExists=\n" in dropin  # configless: no local slurm.conf


def test_sinfo_verdicts_name_what_differs() -> None:
    states = slurm_states.parse_sinfo("gpu01|idle|none\ngpu02|inval|Low RealMemory (reported:"
                                "1000 < 100.00% of configured:2000)\ngpu03|idle*|none\n")
    assert slurm_states.is_healthy(states["gpu01"][0])
    assert not slurm_states.is_healthy(states["gpu02"][0])
    assert not slurm_states.is_healthy("drained") and not slurm_states.is_healthy("idle+drain")
    assert slurm_states.is_healthy("mixed") and slurm_states.is_healthy("allocated")
    problem = slurm_states.problem_of(*states["gpu02"])
    assert "Low RealMemory (reported:1000" in problem and "facts differ" in problem


def test_slurm_is_optional_unless_asked_for(tmp_path: Path) -> None:
    path = tmp_path / "inventory.yaml"
    path.write_text("hosts: [a, b]\n")
    plain = inventory.load(path)
    assert "slurm" not in select_steps(None, None, None, plain)
    assert "slurm" in select_steps(None, None, ["slurm"], plain)
    assert select_steps(["firewall", "slurm"], None, None, plain) == ["firewall", "slurm"]
    assert slurm_settings(plain, ["firewall"]) is None
    with pytest.raises(GpuclusterError, match="only slurm can be added"):
        select_steps(None, None, ["image"], plain)
    path.write_text("slurm:\n  srun_ports: 62000-62100\nhosts: [a, b]\n")
    enabled = inventory.load(path)
    assert "slurm" in select_steps(None, ["smoke"], None, enabled)
    settings = slurm_settings(enabled, ["firewall"])  # --only firewall keeps the ports
    assert settings is not None
    assert config.firewall_ports(settings) == ["6817", "6818", "62000:62100"]


def test_nftables_sets_compare_by_value_as_nft_merges_and_sorts_them() -> None:
    assert port_intervals("{ 6817-6818, 29500, 32768-61999 }") == port_intervals(
        "29500, 6817, 6818, 61000-61999, 32768-60999")
    # As nft lists the rule it was given: nothing to change.
    listed = Firewall("nftables", "32768:60999", (
        "chain inet fw input",
        'ip saddr 10.0.0.2 tcp dport { 6817-6818, 29500, 32768-61999 } accept comment '
        '"gpucluster" # handle 9'))
    assert nftables_commands(listed, ["10.0.0.2"], 29500, ["6817", "6818", "61000:61999"]) \
        == []
    # Without Slurm's ports, the same rule is stale.
    assert nftables_commands(listed, ["10.0.0.2"], 29500)[0] == \
        "nft delete rule inet fw input handle 9"


def test_scripts_are_valid_shell(tmp_path: Path) -> None:
    from gpucluster.slurm.facts import facts_script

    path = tmp_path / "c.yaml"
    path.write_text("cluster:\n  env: {HF_HOME: \"/data/it's here\"}\nhosts:\n"
                    "  - {name: a, address: 10.0.0.1, gpus: 8}\n  - {name: b, address: "
                    "10.0.0.2, gpus: 8}\n")
    loaded = inventory.load(path)
    scripts = [facts_script(), daemons_script("10.0.0.1:6817", start=["munged"],
                                              restart=["slurmd"]),
               daemons_script("", stop=["slurmd", "slurmctld", "munged"]),
               render("slurm/epilog.sh.j2", grace_s=5),
               render("slurm/undo.sh.j2", paths="/etc/slurm/slurm.conf", key="/k", ours="x"),
               sbatch_script(loaded, SbatchRequest("train.py", ("--lr", "1e-3 x"),
                                                   "/srv/it\\'s", synced=True)),
               sbatch_script(loaded, SbatchRequest("train.py", (), "/srv/x", synced=False,
                                                   image="ghcr.io/org/train:1"))]
    for text in scripts:
        checked = subprocess.run(["bash", "-n"], input=text, capture_output=True,
                                 text=True, check=False)
        assert checked.returncode == 0, checked.stderr + text


def test_the_sbatch_script_asks_for_every_node_and_rendezvous_at_the_first(
        tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("cluster:\n  env: {NCCL_IB_HCA: mlx5}\nslurm:\n  partition: train\n"
                    "hosts:\n  - {name: 'gpu[01-04]', address: '10.0.0.[1-4]', gpus: 8}\n")
    text = sbatch_script(inventory.load(path), SbatchRequest(
        "train.py", ("--epochs", "3"), "/srv/gpucluster/proj", synced=True, nodes=2))
    assert "#SBATCH --nodes=2\n" in text and "#SBATCH --gres=gpu:8\n" in text
    assert "#SBATCH --partition=train\n" in text
    assert "export NCCL_IB_HCA=mlx5\n" in text
    assert ('--nnodes "$SLURM_NNODES" --nproc-per-node 8 --rdzv-backend c10d '
            '--rdzv-endpoint "$GPC_HEAD_ADDR:29500" --rdzv-id "slurm-$SLURM_JOB_ID"') in text
    assert '--local_addr "$addr" train.py --epochs 3' in text  # its own NodeAddr
    # As launch: torchrun's default for 8 per node, set ahead of it (no banner from it)
    assert 'export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"' in text
    module = sbatch_script(inventory.load(path), SbatchRequest(
        "pkg.train", ("--epochs", "3"), "/srv/gpucluster/proj", synced=True, module=True))
    assert '--max-restarts 0 --log-dir "$GPC_JOB_DIR"/torchrun --tee 3 --local_addr "$addr" ' \
           '-m pkg.train --epochs 3\n' in module
    # Each line says its node and rank, as launch's: srun labels a task's lines, each
    # task says which node it is, torchrun's tee puts a rank's line behind its rank.
    assert "srun --ntasks-per-node=1 --kill-on-bad-exit=1 --label bash -c" in text
    assert 'echo "gpucluster: $SLURMD_NODENAME is task $SLURM_PROCID"' in text
    assert "TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE='\"'\"'[${rank}]:'\"'\"'" in text
    assert "#SBATCH --job-name=pkg.train\n" in module
    imaged = sbatch_script(inventory.load(path), SbatchRequest(
        "train.py", (), "/srv/gpucluster/proj", synced=True, image="ghcr.io/org/t:1"))
    assert '--name "gpucluster-slurm-$SLURM_JOB_ID" ' in imaged  # one container per job
    assert "-e PYTHONUNBUFFERED -e TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE " in imaged
    # A rank that crashes prints its Python stack, as under launch; in the image too.
    assert 'export PYTHONFAULTHANDLER="${PYTHONFAULTHANDLER-1}"' in text
    assert "-e PYTHONFAULTHANDLER " in imaged
    assert " ghcr.io/org/t:1 torchrun " in imaged


def test_with_install_a_node_without_slurmd_plans_the_install_and_the_rest(
        tmp_path: Path) -> None:
    from gpucluster.provision.model import ProvisionContext
    from gpucluster.provision.steps_slurm import SlurmStep

    path = tmp_path / "c.yaml"
    path.write_text("slurm:\n  install: true\nhosts:\n  - {name: a, address: 10.0.0.1}\n")
    loaded = inventory.load(path)
    absent = "\n".join(f"@@gpc section {i}\nabsent\n@@gpc end 0"
                       for i in range(len(config.managed_paths())))
    bare = parse_facts("a", "10.0.0.1", node_report(hardware="", commands="munged munge "
                                                    "unmunge") + "\n" + absent)
    context = ProvisionContext(loaded, tmp_path, dry_run=True, slurm=loaded.slurm)
    context.gathered.update(slurm={"a": bare}, slurm_unreachable={}, slurm_key=b"k" * 32,
                            slurm_controller="a", slurm_states={})
    summaries = [c.summary for c in SlurmStep().check(context, loaded.hosts[0], None)]  # type: ignore[arg-type]
    assert summaries[0].startswith("install: DEBIAN_FRONTEND=noninteractive apt-get "
                                   "install -y slurm-client slurmctld slurmd")
    assert "write /etc/slurm/slurm.conf" in summaries and "start slurmd" in summaries


def test_export_refuses_more_processes_per_node_than_gpus_before_any_sync(
        tmp_path: Path) -> None:
    from tests.cli import gpucluster

    path = tmp_path / "c.yaml"  # unreachable hosts: nothing may be asked of them
    path.write_text("hosts:\n  - {name: 'gpu[1-2]', address: '192.0.2.[1-2]', gpus: 8}\n")
    (tmp_path / "train.py").write_text("print('x')\n")
    done = gpucluster("export", "sbatch", "-i", str(path), "--nproc-per-node", "16",
                      "train.py", cwd=str(tmp_path), timeout=60)
    assert done.code == 2, done.stderr
    assert "--nproc-per-node 16: gpu[1-2] have 8 GPUs (the inventory's gpus) (fix: " \
           "--nproc-per-node 8 or fewer" in done.stderr
