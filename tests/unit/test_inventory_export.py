"""inventory export: each format read back by the tool that reads it (ansible-inventory,
ssh -G, ClusterShell's nodeset, pdsh's genders module); the slot files by their rules."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.cli import gpucluster

INVENTORY = """\
cluster:
  name: lab
  known_hosts: /etc/gpucluster/known_hosts
defaults:
  user: ubuntu
  identity_file: /keys/id_ed25519
  gpus: 8
hosts:
  - name: bastion
    address: 203.0.113.5
    user: jump
    port: 2222
    gpus: 0
  - name: gpu[01-03]
    address: 10.0.0.[11-13]
    jump_host: bastion
    groups: [train]
  - name: gpu04
    address: 10.0.0.14
    gpus: 4
    groups: [eval]
  - name: gpu05
    address: 10.0.0.15
    spare: true
"""
BIN = Path(sys.executable).parent


@pytest.fixture
def inventory(tmp_path: Path) -> Path:
    path = tmp_path / "cluster.yaml"
    path.write_text(INVENTORY)
    return path


def export(inventory: Path, form: str) -> Path:
    # Ansible's YAML inventory plugin reads only .yml/.yaml files.
    target = inventory.with_name(f"export-{form}.yml")
    done = gpucluster("inventory", "export", "-i", str(inventory), "--format", form,
                      "-o", str(target))
    assert done.code == 0, done.stderr
    return target


def test_ansible_inventory_reads_hosts_vars_and_groups(inventory: Path) -> None:
    listed = subprocess.run([str(BIN / "ansible-inventory"), "-i",
                             str(export(inventory, "ansible")), "--list"],
                            capture_output=True, text=True, check=True)
    data = json.loads(listed.stdout)
    gpu01 = data["_meta"]["hostvars"]["gpu01"]
    assert (gpu01["ansible_host"], gpu01["ansible_user"], gpu01["gpus"]) == (
        "10.0.0.11", "ubuntu", 8)
    assert gpu01["ansible_ssh_common_args"] == "-o ProxyJump=jump@203.0.113.5:2222"
    assert "UserKnownHostsFile=/etc/gpucluster/known_hosts" in gpu01["ansible_ssh_extra_args"]
    assert data["train"]["hosts"] == ["gpu01", "gpu02", "gpu03"]
    assert data["spares"]["hosts"] == ["gpu05"]
    assert "[WARNING]" not in listed.stderr, listed.stderr


def test_ssh_reads_the_host_blocks(inventory: Path) -> None:
    config = export(inventory, "ssh-config")
    resolved = subprocess.run(["ssh", "-G", "-F", str(config), "gpu02"], capture_output=True,
                              text=True, check=True).stdout.splitlines()
    settings = dict(line.split(" ", 1) for line in resolved)
    assert settings["hostname"] == "10.0.0.12" and settings["user"] == "ubuntu"
    assert settings["proxyjump"] == "jump@[203.0.113.5]:2222"  # as ssh normalises it
    assert settings["identityfile"] == "/keys/id_ed25519"
    assert settings["userknownhostsfile"] == "/etc/gpucluster/known_hosts"
    assert settings["stricthostkeychecking"] == "true"
    assert dict(line.split(" ", 1) for line in subprocess.run(
        ["ssh", "-G", "-F", str(config), "bastion"], capture_output=True, text=True,
        check=True).stdout.splitlines())["port"] == "2222"


def test_clustershell_reads_the_groups(inventory: Path, tmp_path: Path) -> None:
    groups_dir = tmp_path / "groups.d"
    groups_dir.mkdir()
    export(inventory, "clush").rename(groups_dir / "lab.yaml")
    conf = tmp_path / "groups.conf"
    conf.write_text(f"[Main]\ndefault: lab\nautodir: {groups_dir}\n")

    def nodeset(group: str) -> str:
        return subprocess.run([str(BIN / "nodeset"), f"--groupsconf={conf}", "-f", group],
                              capture_output=True, text=True, check=True).stdout.strip()

    assert nodeset("@train") == "gpu[01-03]"
    assert nodeset("@all") == "bastion,gpu[01-05]"
    assert nodeset("@spares") == "gpu05"


def test_pdsh_reads_the_genders_file(inventory: Path) -> None:
    genders = export(inventory, "pdsh")
    done = subprocess.run(["pdsh", "-F", str(genders), "-g", "train", "-R", "exec", "echo",
                           "%h"], capture_output=True, text=True, check=True)
    assert sorted(done.stdout.split()) == sorted(
        ["gpu01:", "gpu01", "gpu02:", "gpu02", "gpu03:", "gpu03"])


def test_slot_files_give_each_host_its_gpus_and_leave_spares_out(inventory: Path) -> None:
    assert export(inventory, "hostfile").read_text() == (
        "bastion slots=1\ngpu01 slots=8\ngpu02 slots=8\ngpu03 slots=8\ngpu04 slots=4\n"
        "# spare: gpu05 slots=8\n")
    assert export(inventory, "mpich").read_text().splitlines()[4] == "gpu04:4"


def test_the_tools_own_names_choose_their_formats(inventory: Path) -> None:
    for alias, form in (("openssh", "ssh-config"), ("DeepSpeed", "hostfile"),
                        ("clustershell", "clush")):
        done = gpucluster("inventory", "export", "-i", str(inventory), "-F", alias)
        assert done.code == 0, done.stderr
        assert done.stdout == export(inventory, form).read_text()


def test_an_unknown_format_is_a_one_line_error(inventory: Path) -> None:
    done = gpucluster("inventory", "export", "-i", str(inventory), "--format", "slurm")
    assert done.code == 2
    assert done.stderr.strip() == ("gpucluster: error: --format 'slurm': not a format "
                                   "gpucluster writes (fix: one of ansible, ssh-config, "
                                   "hostfile, mpi, mpich, clush, pdsh)")
