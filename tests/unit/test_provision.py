"""Provision's pure parts: managed blocks, firewall plans, the hosts block, step shapes."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpucluster import inventory
from gpucluster.errors import GpuclusterError, InventoryError
from gpucluster.provision import files
from gpucluster.provision.model import ProvisionContext
from gpucluster.provision.runner import STEP_NAMES, STEP_TYPES
from gpucluster.provision.steps_firewall import (
    Firewall,
    iptables_rule,
    nftables_commands,
    peers_of,
    plan_commands,
    side_by_side_ports,
)
from gpucluster.provision.steps_hosts import HostsStep

ORIGINAL = "127.0.0.1 localhost\n# admin's own line\n10.9.9.9 nas\n"


def test_a_managed_block_is_added_replaced_and_removed_leaving_the_rest() -> None:
    added = files.with_block(ORIGINAL, ["10.0.0.1 a"], at_top=True)
    assert added.splitlines()[0] == files.BEGIN
    assert added.endswith(ORIGINAL)
    replaced = files.with_block(added, ["10.0.0.2 b"], at_top=True)
    assert "10.0.0.1 a" not in replaced and "10.0.0.2 b" in replaced
    assert replaced.count(files.BEGIN) == 1
    assert files.with_block(replaced, ["10.0.0.2 b"], at_top=True) == replaced  # idempotent
    assert files.without_block(replaced) == ORIGINAL
    at_end = files.with_block(ORIGINAL, ["x"])
    assert at_end.startswith(ORIGINAL) and at_end.rstrip().endswith(files.END)
    assert files.with_block(None, ["x"]) == f"{files.BEGIN}\nx\n{files.END}\n"


def test_a_diff_names_the_file_before_and_after() -> None:
    text = files.diff("/etc/hosts", ORIGINAL, ORIGINAL + "1.2.3.4 c\n")
    assert "/etc/hosts (now)" in text and "/etc/hosts (after provision)" in text
    assert "+1.2.3.4 c" in text
    assert files.diff("/etc/hosts", ORIGINAL, ORIGINAL) == ""


def test_iptables_plan_adds_what_is_missing_and_drops_what_is_stale() -> None:
    stale = iptables_rule("10.0.0.9", 29500, "32768:60999")
    kept = iptables_rule("10.0.0.2", 29500, "32768:60999")
    firewall = Firewall("iptables", "32768:60999", (stale, kept))
    commands = plan_commands(firewall, ["10.0.0.2", "10.0.0.3"], 29500)
    assert commands == [
        f"iptables -D INPUT {stale.removeprefix('-A INPUT ')}",
        f"iptables -I INPUT {iptables_rule('10.0.0.3', 29500, '32768:60999')[9:]}",
    ]
    exact = Firewall("iptables", "32768:60999", (kept,))
    assert plan_commands(exact, ["10.0.0.2"], 29500) == []


def test_the_side_by_side_rendezvous_ports_are_opened_with_the_first() -> None:
    """cluster.rendezvous_ports 8: a job on GPU k and up takes 29500 + k (launch --gpus)."""
    assert side_by_side_ports(29500, 1) == []
    assert side_by_side_ports(29500, 2) == ["29501"]
    assert side_by_side_ports(29500, 8) == ["29501:29507"]
    firewall = Firewall("iptables", "32768:60999", ())
    [added] = plan_commands(firewall, ["10.0.0.2"], 29500, side_by_side_ports(29500, 8))
    assert "--dports 29500,29501:29507,32768:60999 " in added


def test_ufw_plan() -> None:
    firewall = Firewall("ufw", "32768:60999", ("10.0.0.9 29500,32768:60999/tcp",
                                               "10.0.0.2 29500,32768:60999/tcp"))
    assert plan_commands(firewall, ["10.0.0.2"], 29500) == [
        "ufw delete allow from 10.0.0.9 to any port 29500,32768:60999 proto tcp"]
    # rendezvous_port changed: the old port's rules go, the new port's come
    assert plan_commands(firewall, ["10.0.0.2"], 29600) == [
        "ufw delete allow from 10.0.0.2 to any port 29500,32768:60999 proto tcp",
        "ufw delete allow from 10.0.0.9 to any port 29500,32768:60999 proto tcp",
        "ufw allow from 10.0.0.2 to any port 29600,32768:60999 proto tcp comment gpucluster",
    ]


def test_firewalld_rules_are_ours_by_record_runtime_and_permanent_alike() -> None:
    def rule(address: str, ports: str) -> str:
        return (f'rule family="ipv4" source address="{address}" port port="{ports}" '
                f'protocol="tcp" accept')

    def listed(kind: str, *rules: str) -> tuple[str, ...]:
        return tuple(f"{kind} {r}" for r in rules)

    ours = (rule("10.0.0.2", "29500"), rule("10.0.0.2", "32768-60999"))
    admin = rule("10.0.0.7", "29500")  # the admin's own rule on our port: never ours
    both = (*listed("permanent", admin, *ours), *listed("runtime", admin, *ours))
    done = Firewall("firewalld", "32768:60999", (*both, *listed("ours", *ours)))
    assert plan_commands(done, ["10.0.0.2"], 29500) == []
    moved = plan_commands(done, ["10.0.0.3"], 29500)
    assert not any("10.0.0.7" in c for c in moved)
    assert sum("--permanent --remove-rich-rule" in c for c in moved) == 2
    assert sum("--permanent --add-rich-rule" in c for c in moved) == 2
    assert sum(c.startswith("firewall-cmd --add-rich-rule") for c in moved) == 2  # runtime
    assert "--reload" not in " ".join(moved)  # it would drop the admin's runtime rules
    assert moved[-1].startswith("mkdir -p /etc/gpucluster && printf") and "10.0.0.3" in moved[-1]
    # A run cut before the runtime was updated is not taken for done.
    cut = Firewall("firewalld", "32768:60999",
                   (*listed("permanent", *ours), *listed("ours", *ours)))
    assert [c.split("=")[0] for c in plan_commands(cut, ["10.0.0.2"], 29500)] == [
        "firewall-cmd --add-rich-rule", "firewall-cmd --add-rich-rule"]
    # Undo removes what the record names, and the record itself.
    undone = plan_commands(done, [], 29500)
    assert len(undone) == 5
    assert undone[-1] == "rm -f /etc/gpucluster/gpucluster.firewalld-rich-rules"
    # Provisioned before the record existed: exact rules of ours are adopted.
    old = Firewall("firewalld", "32768:60999", (*both, "norecord"))
    assert plan_commands(old, ["10.0.0.2"], 29500)[-1].startswith("mkdir -p /etc/gpucluster")


def test_nftables_rules_go_into_the_nodes_own_chain_and_leave_by_handle() -> None:
    firewall = Firewall("nftables", "32768:60999", (
        "chain inet fw input",
        'ip saddr 10.0.0.9 tcp dport { 29500, 32768-60999 } accept comment "gpucluster" '
        "# handle 7",
        "tcp dport 22 accept # handle 3",
    ))
    assert nftables_commands(firewall, ["10.0.0.2"], 29500) == [
        "nft delete rule inet fw input handle 7",
        "nft insert rule inet fw input ip saddr 10.0.0.2 tcp dport '{ 29500, 32768-60999 }' "
        "accept comment gpucluster",
    ]
    moved = nftables_commands(Firewall("nftables", "32768:60999", (
        "chain inet fw input",
        'ip saddr 10.0.0.2 tcp dport { 29500, 32768-60999 } accept comment "gpucluster" '
        "# handle 8")), ["10.0.0.2"], 29600)  # rendezvous_port changed
    assert moved == [
        "nft delete rule inet fw input handle 8",
        "nft insert rule inet fw input ip saddr 10.0.0.2 tcp dport '{ 29600, 32768-60999 }' "
        "accept comment gpucluster",
    ]
    with pytest.raises(GpuclusterError, match="no input chain"):
        nftables_commands(Firewall("nftables", "1:2", ("nothing",)), [], 29500)
    assert plan_commands(Firewall("none", "1:2", ()), ["10.0.0.2"], 29500) == []


def _context(tmp_path: Path, hosts: str) -> ProvisionContext:
    path = tmp_path / "inventory.yaml"
    path.write_text(f"hosts:\n{hosts}")
    return ProvisionContext(inventory.load(path), tmp_path, dry_run=True)


def test_peers_are_the_other_nodes_ip_addresses(tmp_path: Path) -> None:
    context = _context(tmp_path, "  - {name: a, address: 10.0.0.1}\n"
                                 "  - {name: b, address: 10.0.0.2}\n"
                                 "  - {name: c, address: c.example.com}\n")
    assert peers_of(context, context.inventory.host("a")) == ["10.0.0.2"]


def test_the_hosts_block_lists_addresses_with_inventory_and_real_names(tmp_path: Path) -> None:
    context = _context(tmp_path, "  - {name: a, address: 10.0.0.1}\n"
                                 "  - {name: b, address: 10.0.0.2}\n"
                                 "  - {name: c, address: c.example.com}\n")
    context.gathered["hostnames"] = {"a": "gpu-a.internal", "b": "b"}
    block = HostsStep().block(context)
    assert any(line.split() == ["10.0.0.1", "a", "gpu-a.internal"] for line in block)
    assert any(line.split() == ["10.0.0.2", "b"] for line in block)
    assert not any("c.example.com" in line for line in block)  # DNS resolves it


def test_steps_declare_what_the_runner_does_with_them() -> None:
    assert STEP_NAMES == ("parity", "ssh-mesh", "hosts", "firewall", "image", "slurm",
                          "smoke")
    wide = {kind.name for kind in STEP_TYPES if kind.cluster_wide}
    assert wide == {"image", "slurm"}  # the relay, and slurmctld before the slurmds
    assert STEP_TYPES[0]() is not STEP_TYPES[0]()  # fresh per run: no shared state


def _relay_script(first: bool, next_hop: str | None) -> str:
    from gpucluster.templating import render, template_dir

    return render("provision/image_relay.sh.j2", node="node-1", dir="'/srv/x/.relay-1-a'",
                  first=first, next=next_hop,
                  next_dir="\"$HOME\"/'x/.relay-1-b'" if next_hop else None,
                  python="python3",
                  counter=(template_dir() / "provision" / "relay_counter.py").read_text(),
                  sink="podman load >&2", report="podman image inspect x",
                  decompress="zstd -dc", ciphers="aes128-gcm@openssh.com", connect_timeout=10)


@pytest.mark.parametrize("script", ["read", "write", "write-private", "cleanup",
                                    "first-relay", "relay", "last-relay", "only-relay",
                                    "listing", "apply", "pairs"])
def test_scripts_sent_to_nodes_are_valid_shell(script: str) -> None:
    import subprocess

    from gpucluster.launch import workdir
    from gpucluster.templating import render

    path = "\"$HOME\"/'odd dir/hosts'"
    text = {
        "read": lambda: render("provision/read_file.sh.j2", paths=[path, "/etc/hosts"]),
        "write": lambda: files.write_script([
            files.NewFile(path, "abc", "644", was=files.FileState(None)),
            files.NewFile("/etc/hosts", "x", "644", was=files.FileState("y"))],
            before="mkdir -p ~/.ssh")[0],
        "write-private": lambda: files.write_script([files.NewFile(
            path, "abc", "600", private=True, owner="munge:munge")])[0],
        "cleanup": lambda: render("provision/relay_cleanup.sh.j2", dir="'/srv/.relay-1'"),
        "first-relay": lambda: _relay_script(True, "node-2"),
        "relay": lambda: _relay_script(False, "node-2"),
        "last-relay": lambda: _relay_script(False, None),
        "only-relay": lambda: _relay_script(True, None),
        "listing": lambda: workdir.listing_command(path),
        "apply": lambda: workdir.apply_command(path, ("a b", "it's"), "node1"),
        "pairs": lambda: render("provision/ssh_pairs.sh.j2", timeout=5,
                                peers=["node-2", "it's"]),
    }[script]()
    checked = subprocess.run(["sh", "-n"], input=text, capture_output=True, text=True,
                             check=False)
    assert checked.returncode == 0, checked.stderr


def test_the_relay_counter_passes_bytes_through_and_reports_them() -> None:
    import subprocess
    import sys

    from gpucluster import reports
    from gpucluster.templating import template_dir

    counter = (template_dir() / "provision" / "relay_counter.py").read_text()
    data = bytes(range(256)) * 5000
    done = subprocess.run([sys.executable, "-c", counter, "node-3"], input=data,
                          capture_output=True, check=True)
    assert done.stdout == data
    last = reports.by_kind(done.stderr.decode())["progress"][-1]
    assert last == f"node-3 {len(data)} done"


def test_each_run_gets_a_command_log_of_its_own_even_within_one_second(
        tmp_path: Path) -> None:
    """A re-run right after a run (the same second) used to append to the run's log."""
    from gpucluster.provision.logged import CommandLog
    from gpucluster.state import new_log

    logs = [CommandLog(new_log(tmp_path / "logs", "provision-")) for _ in range(3)]
    for number, log in enumerate(logs):
        log.write("node1", f"run {number}")
    paths = [log.path for log in logs]
    assert len(set(paths)) == 3 and all(p.name.startswith("provision-") for p in paths)
    assert [p.read_text().split(": ", 1)[1] for p in paths] == ["run 0\n", "run 1\n",
                                                                "run 2\n"]
    assert (tmp_path / "logs").stat().st_mode & 0o777 == 0o700


def test_files_are_read_and_written_atomically_keeping_mode(tmp_path: Path) -> None:
    from gpucluster.provision.logged import CommandLog, LoggedConnection
    from gpucluster.remote.local import LocalConnection

    connection = LoggedConnection(LocalConnection("here"), CommandLog(tmp_path / "log"))
    target = tmp_path / "odd dir" / "hosts"
    target.parent.mkdir()
    assert files.read(connection, str(target)) is None
    files.write_atomically(connection, str(target), "one\n", "640")
    assert target.read_text() == "one\n" and target.stat().st_mode & 0o777 == 0o640
    target.chmod(0o604)
    files.write_atomically(connection, str(target), "two\n", "640")
    assert files.read(connection, str(target)) == "two\n"
    assert target.stat().st_mode & 0o777 == 0o604  # an existing file keeps its mode
    assert [p.name for p in target.parent.iterdir()] == ["hosts"]  # no temp file left
    assert files.read_state(connection, str(target)) == files.FileState("two\n", "604")


def test_a_symlink_keeps_pointing_and_a_private_file_is_made_private(tmp_path: Path) -> None:
    from gpucluster.provision.logged import CommandLog, LoggedConnection
    from gpucluster.remote.local import LocalConnection

    connection = LoggedConnection(LocalConnection("here"), CommandLog(tmp_path / "log"))
    real = tmp_path / "real-hosts"
    real.write_text("old\n")
    link = tmp_path / "hosts"
    link.symlink_to(real)
    files.write_atomically(connection, str(link), "new\n", "644")
    assert link.is_symlink() and real.read_text() == "new\n"
    key = tmp_path / "id_key"
    key.write_text("k\n")
    key.chmod(0o644)  # a key file someone left readable
    files.write_atomically(connection, str(key), "secret\n", "600", private=True)
    assert key.stat().st_mode & 0o777 == 0o600 and key.read_text() == "secret\n"


def test_an_immutable_file_is_named_as_such_and_left_as_it_was(tmp_path: Path) -> None:
    """An admin's `chattr +i /etc/hosts` made root's rename fail with mv's bare
    "Operation not permitted"; the error now names the attribute and its fix."""
    import os
    import subprocess

    from gpucluster.provision.logged import CommandLog, LoggedConnection
    from gpucluster.remote.local import LocalConnection
    from gpucluster.remote.result import RemoteError

    if os.geteuid() != 0:
        pytest.skip("chattr +i needs root (CI runs as root, for the sandbox)")
    connection = LoggedConnection(LocalConnection("here"), CommandLog(tmp_path / "log"))
    target = tmp_path / "hosts"
    target.write_text("127.0.0.1 localhost\n")
    subprocess.run(["chattr", "+i", str(target)], check=True)
    try:
        with pytest.raises(RemoteError) as refused:
            files.write_atomically(connection, str(target), "changed\n", "644")
    finally:
        subprocess.run(["chattr", "-i", str(target)], check=True)
    assert refused.value.message == (
        f"cannot write {target}: {target} is immutable or append-only (chattr +i or +a): "
        f"left as it was (fix: chattr -i -a {target}, then run this again)")
    assert target.read_text() == "127.0.0.1 localhost\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hosts", "log"]  # no temp file


def test_a_write_cut_short_leaves_the_file_as_it_was(tmp_path: Path) -> None:
    import subprocess

    target = tmp_path / "authorized_keys"
    target.write_text("ssh-ed25519 AAAA admin\n")
    whole = "ssh-ed25519 AAAA admin\nssh-ed25519 BBBB cluster\n"
    script, data = files.write_script([files.NewFile(str(target), whole, "600")])
    cut = subprocess.run(["sh", "-c", script], input=data[:30], capture_output=True,
                         check=False)  # the connection dropped after 30 bytes
    assert cut.returncode == 3 and b"arrived incomplete" in cut.stderr
    assert target.read_text() == "ssh-ed25519 AAAA admin\n"
    assert [p.name for p in tmp_path.iterdir()] == ["authorized_keys"]


def test_files_written_in_one_round_are_all_new_or_all_as_they_were(tmp_path: Path) -> None:
    """ssh-mesh writes five files in one round trip: a connection cut inside the second
    file's bytes must not leave the first one new and the others old."""
    import subprocess

    first, second = tmp_path / "config", tmp_path / "known_hosts"
    first.write_text("Host old\n")
    second.write_text("old key\n")
    script, data = files.write_script([files.NewFile(str(first), "Host new\n", "600"),
                                       files.NewFile(str(second), "new key\n", "600")])
    cut = subprocess.run(["sh", "-c", script], input=data[:12], capture_output=True,
                         check=False)  # all of the first file, half of the second
    assert cut.returncode == 3 and b"every file left as it was" in cut.stderr
    assert (first.read_text(), second.read_text()) == ("Host old\n", "old key\n")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config", "known_hosts"]
    whole = subprocess.run(["sh", "-c", script], input=data, capture_output=True,
                           check=False)
    assert whole.returncode == 0, whole.stderr
    assert (first.read_text(), second.read_text()) == ("Host new\n", "new key\n")


def test_a_file_edited_after_provision_read_it_is_not_overwritten(tmp_path: Path) -> None:
    """The plan is made on what was read (ahead, seconds before): a line someone added to
    authorized_keys meanwhile would be lost by writing the plan over it."""
    from gpucluster.provision.logged import CommandLog, LoggedConnection
    from gpucluster.remote.local import LocalConnection
    from gpucluster.remote.result import RemoteError

    connection = LoggedConnection(LocalConnection("here"), CommandLog(tmp_path / "log"))
    keys, config = tmp_path / "authorized_keys", tmp_path / "config"
    keys.write_text("ssh-ed25519 AAAA admin\n")
    seen = files.read_states(connection, [str(keys), str(config)])
    keys.write_text("ssh-ed25519 AAAA admin\nssh-ed25519 CCCC colleague\n")  # meanwhile
    planned = [files.NewFile(str(keys), "ssh-ed25519 AAAA admin\nssh-ed25519 BBBB cluster\n",
                             "600", was=seen[str(keys)]),
               files.NewFile(str(config), "Host node2\n", "600", was=seen[str(config)])]
    with pytest.raises(RemoteError) as refused:
        files.write_all(connection, planned)
    assert f"{keys} changed since provision read it: every file left as it was" \
        in refused.value.message
    assert "CCCC colleague" in keys.read_text() and not config.exists()
    files.write_all(connection, [planned[1]])  # absent when read, absent now: written
    assert config.read_text() == "Host node2\n"
    # A home shared by every node: another node wrote the same meanwhile; not a conflict.
    files.write_all(connection, [files.NewFile(str(config), "Host node2\n", "600",
                                               was=files.FileState(None))])


def test_the_files_read_back_with_a_write_answer_the_recheck(tmp_path: Path) -> None:
    from gpucluster.provision.logged import CommandLog, LoggedConnection
    from gpucluster.remote.local import LocalConnection

    log = CommandLog(tmp_path / "log")
    connection = LoggedConnection(LocalConnection("here"), log)
    paths = [str(tmp_path / "a"), str(tmp_path / "b")]
    files.write_all(connection, [files.NewFile(paths[0], "one\n", "640"),
                                 files.NewFile(paths[1], "two\n", "600", private=True)])
    (tmp_path / "a").write_text("changed by hand\n")  # after the write's own read
    states = files.read_states(connection, paths)
    assert states == {paths[0]: files.FileState("one\n", "640"),
                      paths[1]: files.FileState("two\n", "600")}
    assert log.path.read_text().splitlines()[-1].endswith("read back with the write")
    assert files.read(connection, paths[0]) == "changed by hand\n"  # asked again: read


def test_a_steps_writes_keep_the_other_steps_reads_ahead(tmp_path: Path) -> None:
    from gpucluster.provision.logged import CommandLog, LoggedConnection
    from gpucluster.remote.local import LocalConnection
    from gpucluster.remote.result import CommandResult

    own, other = (f"cat {tmp_path}/own", False), (f"cat {tmp_path}/other", False)
    primed = {read: CommandResult("here", read[0], 0, "read ahead", "", 0.0)
              for read in (own, other)}
    narrowed = LoggedConnection(LocalConnection("here"), CommandLog(tmp_path / "log"), primed)
    narrowed.writes_change = [own]
    everything = LoggedConnection(LocalConnection("here"), CommandLog(tmp_path / "log"),
                                  primed)
    for connection in (narrowed, everything):
        connection.run("true", timeout=10)  # a write, as far as the cache can tell
    assert narrowed.run(other[0], timeout=10).stdout == "read ahead"
    assert narrowed.run(own[0], timeout=10).exit_code != 0  # asked of the machine: no file
    assert everything.run(other[0], timeout=10).exit_code != 0


def test_hostnames_that_would_poison_every_nodes_files_are_left_out() -> None:
    from gpucluster.provision.hostnames import vet

    reported = {"a": "gpu-a.internal", "b": "localhost", "c": "ubuntu", "d": "ubuntu",
                "e": "x\nProxyCommand touch /tmp/pwned", "f": "g", "g": "g"}
    usable, dropped = vet(reported, ["a", "b", "c", "d", "e", "f", "g"])
    assert usable == {"a": "gpu-a.internal", "g": "g"}  # g keeps its own name
    assert "loopback" in dropped["b"] and "reported by 2 nodes" in dropped["c"]
    assert "not a valid host name" in dropped["e"] and "another inventory host" in dropped["f"]
    assert dropped["b"].endswith("(fix: hostnamectl set-hostname b)")


def test_the_hosts_block_leaves_out_a_dropped_name(tmp_path: Path) -> None:
    context = _context(tmp_path, "  - {name: a, address: 10.0.0.1}\n"
                                 "  - {name: b, address: 10.0.0.2}\n")
    from gpucluster.provision.model import hostnames

    def each(task, hosts=None):  # what every node answers to `hostname`
        from gpucluster.remote.result import FanoutResult
        return FanoutResult(("a", "b"), {"a": "localhost\n", "b": "real-b\n"})

    assert hostnames(context, each) == {"b": "real-b"}
    block = HostsStep().block(context)
    assert any(line.split() == ["10.0.0.1", "a"] for line in block)
    assert any(line.split() == ["10.0.0.2", "b", "real-b"] for line in block)
    assert "loopback" in HostsStep().note(context, context.inventory.host("a"))


def test_the_cluster_key_is_authorized_from_cluster_addresses_only_and_in_place() -> None:
    from gpucluster.provision.steps_ssh_mesh import authorized_with

    public = "ssh-ed25519 AAAAC3Nz gpucluster"
    admin = ["ssh-rsa AAAAB3 admin@laptop", "ssh-ed25519 AAAAC3Nz gpucluster",
             "ssh-ed25519 AAAAX other"]
    lines = authorized_with(admin, public, ["10.0.0.1", "10.0.0.2"])
    assert lines == ["ssh-rsa AAAAB3 admin@laptop",
                     'from="10.0.0.1,10.0.0.2" ssh-ed25519 AAAAC3Nz gpucluster',
                     "ssh-ed25519 AAAAX other"]
    assert authorized_with(lines, public, ["10.0.0.1", "10.0.0.2"]) == lines  # idempotent
    assert authorized_with([], public, ["10.0.0.1", "gpu2.example.com"]) == [public]


def test_two_clusters_on_one_node_keep_their_own_blocks_keys_and_rules(tmp_path: Path) -> None:
    from gpucluster.provision.steps_ssh_mesh import key_name

    text = files.with_block(ORIGINAL, ["10.0.0.1 a"], name="train")
    text = files.with_block(text, ["10.0.0.9 z"], name="eval")
    assert files.with_block(text, ["10.0.0.1 a"], name="train") == text
    assert files.without_block(text, name="train") == files.with_block(ORIGINAL, ["10.0.0.9 z"],
                                                                       name="eval")
    assert key_name("train") != key_name("eval") and key_name("gpucluster") == \
        "gpucluster_ed25519"  # what nodes provisioned before cluster names have
    train = Firewall("nftables", "32768:60999", (
        "chain inet fw input",
        'ip saddr 10.0.0.9 tcp dport { 29500, 32768-60999 } accept comment "eval" # handle 7',
    ), tag="train")
    assert nftables_commands(train, [], 29500) == []  # the other cluster's rule stays
    assert "--comment train " in iptables_rule("10.0.0.2", 29500, "1:2", "train")
    context = _context(tmp_path, "  - {name: a, address: 10.0.0.1}\n")
    assert context.inventory.cluster.name == "gpucluster"
    (tmp_path / "named.yaml").write_text("cluster: {name: Bad_Name}\nhosts: [a]\n")
    with pytest.raises(InventoryError, match="lowercase letters, digits"):
        inventory.load(tmp_path / "named.yaml")


def test_bytes_outside_the_block_survive_a_rewrite_exactly(tmp_path: Path) -> None:
    from gpucluster.provision.logged import CommandLog, LoggedConnection
    from gpucluster.remote.local import LocalConnection

    connection = LoggedConnection(LocalConnection("here"), CommandLog(tmp_path / "log"))
    target = tmp_path / "hosts"
    original = b"127.0.0.1 localhost\r\n10.0.0.9 caf\xe9-latin1\r\n\x0bodd\n"
    target.write_bytes(original)
    current = files.read(connection, str(target))
    assert current is not None
    files.write_atomically(connection, str(target),
                           files.with_block(current, ["10.0.0.1 a"], at_top=True), "644")
    written = target.read_bytes()
    assert written.endswith(original)  # CRLF, a non-UTF-8 byte, a \x0b: all kept
    assert written.startswith(files.BEGIN.encode() + b"\n10.0.0.1 a\n")
    back = files.read(connection, str(target))
    assert back is not None
    files.write_atomically(connection, str(target), files.without_block(back), "644")
    assert target.read_bytes() == original
    assert "\ufffd" in files.diff("hosts", back, current)  # shown, not crashing a view


def test_undoing_the_mesh_removes_its_key_line_and_blocks_and_nothing_else(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A line is the cluster key's by the key itself, never by a word it shares with it;
    a file that holds nothing of the mesh is not rewritten (its missing final newline
    kept). The integration test checks the same on real nodes, byte for byte."""
    from gpucluster.provision.logged import CommandLog, LoggedConnection
    from gpucluster.provision.steps_ssh_mesh import SshMeshStep
    from gpucluster.remote.local import LocalConnection

    monkeypatch.setenv("HOME", str(tmp_path))  # the node's ~ (sshd's, LocalConnection's)
    context = _context(tmp_path, "  - {name: a, address: 10.0.0.1}\n")
    ssh = tmp_path / ".ssh"
    ssh.mkdir(mode=0o700)
    public = "ssh-ed25519 AAAAC3NzaCLUSTER gpucluster-cluster"
    mine = "ssh-ed25519 AAAAC3NzaMINE public key of alice, gpucluster-cluster ssh-ed25519"
    (ssh / "gpucluster_ed25519").write_text("private\n")
    (ssh / "gpucluster_ed25519.pub").write_text(public + "\n")
    (ssh / "authorized_keys").write_text(f'{mine}\nfrom="10.0.0.1" {public}\n')
    (ssh / "known_hosts").write_text(files.with_block("peer ssh-ed25519 AAAAPEER\n",
                                                      ["a ssh-ed25519 AAAAA"]))
    (ssh / "config").write_text("Host other\n  User bob")  # no block, no final newline
    connection = LoggedConnection(LocalConnection("here"), CommandLog(tmp_path / "log"))
    step, host = SshMeshStep(), context.inventory.hosts[0]
    undone = step.undo(context, host, connection)
    assert sorted(undone) == ["~/.ssh/authorized_keys", "~/.ssh/gpucluster_ed25519",
                              "~/.ssh/gpucluster_ed25519.pub", "~/.ssh/known_hosts"]
    assert (ssh / "authorized_keys").read_text() == mine + "\n"
    assert (ssh / "known_hosts").read_text() == "peer ssh-ed25519 AAAAPEER\n"
    assert (ssh / "config").read_text() == "Host other\n  User bob"
    assert sorted(p.name for p in ssh.iterdir()) == ["authorized_keys", "config", "known_hosts"]
    (ssh / "authorized_keys").write_text(mine)  # nothing of the mesh left: untouched
    assert step.undo(context, host, connection) == []
    assert (ssh / "authorized_keys").read_text() == mine


def test_image_file_hops_sharing_a_work_dir_each_rename_a_whole_copy(tmp_path: Path) -> None:
    import hashlib
    import os
    import subprocess

    from gpucluster.provision.image_source import ImageSource
    from gpucluster.provision.steps_image import _sink_and_report

    path = tmp_path / "inventory.yaml"
    path.write_text(f"cluster: {{work_dir: {tmp_path / 'shared'}}}\nhosts: [a]\n")
    context = ProvisionContext(inventory.load(path), tmp_path, dry_run=False)
    data = os.urandom(8 << 20)
    image = ImageSource("model.sif", hashlib.sha256(data).hexdigest(), len(data),
                        ("cat", "/x"), kind="file")
    hops = []
    for node in ("node1", "node2", "node3"):  # three hops writing the same shared path
        sink, report = _sink_and_report(context, image, "podman", False, node)
        hops.append(subprocess.Popen(["sh", "-c", f"{sink} && {report}"],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE))
    outputs = [hop.communicate(data, timeout=60)[0].decode().strip() for hop in hops]
    images = tmp_path / "shared" / "images"
    assert outputs == [image.image_id] * 3
    assert (images / "model.sif").read_bytes() == data
    assert (images / "model.sif.sha256").read_text() == image.image_id + "\n"
    assert sorted(p.name for p in images.iterdir()) == ["model.sif", "model.sif.sha256"]


def test_ipv6_peers_get_their_own_family_in_every_firewall() -> None:
    v6 = "fd00::12"
    rule = iptables_rule(v6, 29500, "1:2")
    assert rule.startswith("-A INPUT -s fd00::12/128 ")
    assert plan_commands(Firewall("iptables", "1:2", ()), [v6, "10.0.0.2"], 29500) == [
        f"iptables -I INPUT {iptables_rule('10.0.0.2', 29500, '1:2')[9:]}",
        f"ip6tables -I INPUT {rule[9:]}",
    ]
    assert plan_commands(Firewall("iptables", "1:2", (rule,)), [], 29500) == [
        f"ip6tables -D INPUT {rule[9:]}"]
    firewalld = plan_commands(Firewall("firewalld", "1:2", ("norecord",)), [v6], 29500)
    assert all('family="ipv6" source address="fd00::12"' in c for c in firewalld[:4])
    assert plan_commands(Firewall("ufw", "1:2", ()), [v6], 29500) == [
        "ufw allow from fd00::12 to any port 29500,1:2 proto tcp comment gpucluster"]
    with pytest.raises(GpuclusterError, match="IPv4-only table"):
        nftables_commands(Firewall("nftables", "1:2", ("chain ip fw input",)), [v6], 29500)
    kept = Firewall("nftables", "1:2", (
        "chain inet fw input",
        'ip6 saddr fd00::12 tcp dport { 29500, 1-2 } accept comment "gpucluster" # handle 4'))
    assert nftables_commands(kept, [v6], 29500) == []


def test_reads_done_ahead_arrive_exactly_and_serve_each_command_once(tmp_path: Path) -> None:
    import subprocess

    from gpucluster import reports
    from gpucluster.provision import prefetch
    from gpucluster.provision.logged import CommandLog, LoggedConnection
    from gpucluster.remote.local import LocalConnection

    marker = tmp_path / "marker"
    reads = [("echo before; exit 3", False), ("printf 'a\\n\\nb\\n\\n'", False),
             (f"cat {marker}", False)]
    marker.write_text("first\n")
    output = subprocess.run(["sh", "-c", prefetch.script(reads)], capture_output=True,
                            text=True, check=True).stdout
    primed = prefetch.parse("n1", reports.sections(output), reads)
    assert primed[reads[0]].exit_code == 3 and primed[reads[0]].stdout == "before\n"
    assert primed[reads[1]].stdout == "a\n\nb\n\n"  # trailing newlines kept

    log = CommandLog(tmp_path / "log")
    connection = LoggedConnection(LocalConnection("n1"), log, primed)
    marker.write_text("second\n")
    assert connection.run(f"cat {marker}", timeout=5).stdout == "first\n"  # read ahead
    assert connection.run(f"cat {marker}", timeout=5).stdout == "second\n"  # once only
    # A command that was not read ahead (a write) drops the rest: it may change them.
    again = LoggedConnection(LocalConnection("n1"), log, primed)
    assert again.run(f"echo third > {marker}", timeout=5).ok
    assert again.run(f"cat {marker}", timeout=5).stdout == "third\n"
    assert "read ahead" in log.path.read_text()
