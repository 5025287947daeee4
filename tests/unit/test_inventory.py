from __future__ import annotations

import re
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpucluster import inventory
from gpucluster.errors import GpuclusterError, InventoryError

ROOT = Path(__file__).resolve().parents[2]


def write(tmp_path: Path, text: str, name: str = "inventory.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def problems(path: Path) -> list[str]:
    with pytest.raises(InventoryError) as caught:
        inventory.load(path)
    return [str(p) for p in caught.value.problems]


def test_the_example_inventory_is_valid_and_complete() -> None:
    loaded = inventory.load(ROOT / "inventory.example.yaml")
    names = [h.name for h in loaded.hosts]
    assert names[:5] == ["gpu01", "gpu02", "gpu03", "gpu04", "gpu05"]
    assert loaded.host("gpu03").address == "10.0.0.13"
    assert loaded.host("gpu05").gpus == 4 and loaded.host("gpu01").gpus == 8
    assert loaded.host("gpu05").labels == {"site": "dc1", "role": "eval"}
    assert loaded.groups["train"] == ("gpu01", "gpu02", "gpu03", "gpu04")
    assert loaded.cluster.env == {"NCCL_DEBUG": "WARN", "OMP_NUM_THREADS": "8"}
    assert loaded.cluster.rendezvous_port == 29500
    # Every key the loader knows is shown (commented or not) in the example.
    text = (ROOT / "inventory.example.yaml").read_text()
    for key in [*inventory.CLUSTER_KEYS, *inventory.HOST_KEYS, *inventory.SMOKE_KEYS,
                *inventory.SLURM_KEYS]:
        assert f"{key}:" in text, key
    assert loaded.smoke.min_busbw_gbps == 100
    assert loaded.slurm is not None and loaded.slurm.controller == "gpu01"


def test_examples_are_valid() -> None:
    loaded = inventory.load(ROOT / "examples" / "bastion.yaml")
    assert loaded.host("gpu03").jump_host == "bastion"
    assert loaded.host("bastion").jump_host is None  # `null` drops the default
    assert loaded.groups["first-half"] == ("gpu01", "gpu02")


def test_minimal_inventory_gets_defaults(tmp_path: Path) -> None:
    loaded = inventory.load(write(tmp_path, "hosts: [gpu01, localhost]\n"))
    gpu01, local = loaded.hosts
    assert gpu01.address == "gpu01" and gpu01.port == 22 and not gpu01.is_local
    assert local.is_local
    assert loaded.cluster.rendezvous_port == 29500
    assert loaded.head.name == "gpu01"


def test_text_values_are_taken_as_written_where_yaml_reads_a_number(tmp_path: Path
                                                                    ) -> None:
    """YAML reads `3.10` as 3.1, `010` as 8 and `01` as 1; where the key means text (an
    env value, a label, a group's name) the text as written reaches the nodes."""
    from gpucluster.inventory.export import ansible

    loaded = inventory.load(write(tmp_path, (
        "cluster:\n  env: {PYTHON_VERSION: 3.10, NCCL_IB_GID_INDEX: 03, THREADS: 8}\n"
        "groups: {01: [gpu7]}\n"
        "hosts:\n  - name: gpu7\n    port: 0x8AE\n    gpus: 010\n"
        "    labels: {rack: 010, 07: row}\n")))
    assert loaded.cluster.env == {"PYTHON_VERSION": "3.10", "NCCL_IB_GID_INDEX": "03",
                                  "THREADS": "8"}
    host = loaded.host("gpu7")
    assert host.labels == {"rack": "010", "07": "row"}
    assert loaded.groups == {"01": ("gpu7",)}
    # Numbers stay numbers, and plain ones: the export writes them with yaml.safe_dump.
    assert (host.port, host.gpus) == (2222, 8)
    assert type(host.port) is int and type(host.gpus) is int
    assert "ansible_port: 2222" in ansible(loaded)


def test_dates_are_text_as_written(tmp_path: Path) -> None:
    """No key takes a date: YAML's would reach a node as `2024-01-01` only by luck of
    str(), and `2024-13-45` would not load at all."""
    loaded = inventory.load(write(tmp_path, (
        "cluster:\n  env: {RUN_DATE: 2024-01-01, ODD: 2024-13-45, AT: 2024-01-01 10:00:00}\n"
        "hosts:\n  - name: gpu7\n    labels: {since: 2024-01-01}\n")))
    assert loaded.cluster.env == {"RUN_DATE": "2024-01-01", "ODD": "2024-13-45",
                                  "AT": "2024-01-01 10:00:00"}
    assert loaded.host("gpu7").labels == {"since": "2024-01-01"}


def test_each_bad_item_of_env_and_labels_is_said_at_its_own_line(tmp_path: Path) -> None:
    path = write(tmp_path, """\
hosts:
  - name: gpu01
    labels:
      rack:
      ib: yes
cluster:
  env:
    EMPTY:
    1BAD: x
    FINE: " "
    LIST: [1, 2]
""")
    with pytest.raises(InventoryError) as error:
        inventory.load(path)
    lines = str(error.value).splitlines()
    assert lines == [
        f"{path}:4: host.labels.rack has no value (fix: give it a value, or remove the line)",
        f"{path}:5: host.labels.ib has a bad value True (fix: quote it: YAML reads an "
        "unquoted yes/no, on/off or true/false as a boolean)",
        f'{path}:8: cluster.env.EMPTY has no value (fix: write EMPTY: "" for an empty value, '
        "or remove the line)",
        f"{path}:9: cluster.env.1BAD is not a valid environment variable name (fix: use "
        "letters, digits and '_', not starting with a digit)",
        f"{path}:11: cluster.env.LIST has a bad value [1, 2] (fix: give LIST one value: a "
        "string, a number or true/false)",
    ]


def test_every_problem_is_reported_at_once_with_lines(tmp_path: Path) -> None:
    path = write(tmp_path, """\
cluster:
  rendezvous_prot: 29500
  fanout: lots
defaults:
  port: 70000
hosts:
  - name: gpu01
    adress: 10.0.0.1
  - name: gpu01
  - name: gpu02
    address: 10.0.0.9
  - name: gpu03
    address: 10.0.0.9
""")
    found = problems(path)
    text = "\n".join(found)
    assert f"{path}:2: unknown key 'rendezvous_prot' in cluster (fix: did you mean " \
           f"'rendezvous_port'?)" in found
    assert f"{path}:3: cluster.fanout has a bad integer value 'lots'" in text
    assert f"{path}:5: defaults.port has a bad port value 70000" in text
    assert f"{path}:8: unknown key 'adress' in host entry (fix: did you mean 'address'?)" \
        in found
    assert f"{path}:9: duplicate host 'gpu01' (first defined on line 7)" in text
    assert f"{path}:12: host 'gpu03' has the same address 10.0.0.9:22 as 'gpu02'" in text
    assert len(found) == 6


@pytest.mark.parametrize(("text", "expected"), [
    ("", "inventory is empty"),
    ("hosts: []\n", ":1: no hosts"),
    ("cluster: {}\n", "no hosts"),
    ("- gpu01\n", ":1: top level must be a mapping"),
    ("hosts: gpu01\n", ":1: `hosts` must be a list"),
    ("hosts:\n  - name: gpu01\n    port: '22'\n", ":3: host.port has a bad port value '22' "
     "(fix: write the number without quotes: 22)"),
    ("hosts:\n  - name: gpu01\n    port: 0\n", "(fix: use a port number from 1 to 65535)"),
    ("hosts:\n  - name: a\n    address: 10.0.0.300\n",
     ":3: address '10.0.0.300' is not an IP address (fix: give four numbers from 0 to 255"),
    ("hosts:\n  - name: a[1-2]\n    address: 10.0.0.[255-256]\n",
     ":3: address '10.0.0.256' is not an IP address"),
    ("hosts: [10.0.0.5, 10.0.0.300]\n", ":1: host name '10.0.0.300' is not an IP address"),
    ("hosts:\n  - name: a\n    address: '10.0.0.'\n", ":3: address '10.0.0.' is not an IP"),
    ("hosts:\n  - name: a\n    address: '[fe80::1]'\n", ":2: address '[fe80::1]' is in brackets "
     "(fix: write the IPv6 address bare: address: 'fe80::1' (brackets here mean a host range))"),
    ("hosts:\n  - name: gpu[01-04]\n    address: 10.0.0.[1-3]\n", ":2: 4 names but 3 addresses"),
    ("hosts:\n  - name: gpu[04-01]\n", ":2: bad host range in name"),
    ("hosts:\n  - address: 10.0.0.1\n", ":2: host entry has no `name`"),
    # A key left empty was dropped: the host with it, or the value for the default.
    ("hosts:\n  - name:\n", ":2: host.name has no value (fix: give it a value)"),
    ("hosts:\n  - name: a\n    address:\n", ":3: host.address has no value (fix: give it a "
     "value, or remove the line for the default)"),
    ("hosts:\n  - [a, b]\n", ":2: host entry must be a name or a mapping"),
    ("hosts: [a]\ngroups:\n  g: [b]\n", ":3: group 'g' names unknown hosts: b"),
    # A group -g can never select, or that splits in a genders file (pdsh -g).
    ("hosts: [a]\ngroups:\n  '': [a]\n", ":3: group name '' is empty or has characters a "
     "group name cannot (fix: use letters, digits, '_', '.' and '-', not starting with"),
    ("hosts: [a]\ngroups:\n  'x y': [a]\n", ":3: group name 'x y' is empty or has"),
    ("hosts:\n  - name: a\n    groups: ['a,b']\n", ":3: host.groups has a bad list value"),
    ("hosts: [a]\ncluster:\n  env: {1BAD: x}\n", "not a valid environment variable name"),
    ("hosts: [a]\ncluster:\n  env: {OK: 1, A: [1, 2]}\n",
     ":3: cluster.env.A has a bad value [1, 2] (fix: give A one value: a string, a number "
     "or true/false)"),
    ("hosts: [a]\nhosts: [b]\n", ":2: key 'hosts' appears twice"),
    ("hosts: [a\n", "not valid YAML"),
    ("hosts: [a]\nwhen: !!int abc\n", "not valid YAML"),
    # Valid YAML an inventory does not take is not called invalid (nor "fix the syntax").
    ("hosts: [a]\n---\nhosts: [b]\n", ":2: a second YAML document starts here (a `---` "
     "line): an inventory is one document (fix: remove the `---` line, or merge"),
    ("hosts: [a]\ncluster:\n  env:\n    X: !include x.yaml\n", ":4: the YAML tag !include "
     "is not one an inventory reads (fix: write the value itself"),
    ("hosts: [a]\nx: !!python/object:os.system ls\n",
     ":2: the YAML tag !!python/object:os.system is not one"),
    ("hosts:\n  - name: 'a b'\n", "characters a hostname cannot"),
    ("hosts:\n  - name: a\n    address: '10.0.0.1; rm -rf /'\n",
     ":3: address '10.0.0.1; rm -rf /' is neither an IP address nor a host name"),
    ("hosts:\n  - name: a[1-2]\n    address: '10.0.0.[1-2] '\n",
     ":3: address '10.0.0.1 ' is neither"),
    ("hosts:\n  - name: a\n    user: 'x;y'\n", ":3: host.user has a bad login name value"),
    ("defaults:\n  user: root admin\nhosts: [a]\n", ":2: defaults.user has a bad login name"),
    ("\t- name: a\n", ":1: a tab indents this line: YAML indents with spaces only"),
    ("defaults:\n  jump_host: b\nhosts: [a, b]\n", "'b' reaches itself through jump_host"),
    ("smoke:\n  min_busbw_gbps: -1\nhosts: [a]\n", ":2: smoke.min_busbw_gbps has a bad number"),
    # YAML's .inf and .nan are floats; nan passed `value <= 0` being false.
    ("cluster:\n  command_timeout: .inf\nhosts: [a]\n",
     ":2: cluster.command_timeout has a bad seconds value inf (fix: use a number of seconds"),
    ("cluster:\n  connect_timeout: .nan\nhosts: [a]\n",
     ":2: cluster.connect_timeout has a bad seconds value nan"),
    ("smoke:\n  min_busbw_gbps: .nan\nhosts: [a]\n", ":2: smoke.min_busbw_gbps has a bad number"),
    ("smoke:\n  min_busbw: 5\nhosts: [a]\n", "did you mean 'min_busbw_gbps'?"),
    ("slurm:\n  controller: b\nhosts: [a]\n", ":2: slurm.controller 'b' is not a host"),
    ("slurm:\n  srun_ports: 100-50\nhosts: [a]\n", ":2: slurm.srun_ports has a bad port range"),
    ("slurm:\n  node_timeout: 5\nhosts: [a]\n", ":2: slurm.node_timeout has a bad node timeout "
     "value 5 (fix: use whole seconds from 10 to 3600"),
    # Relative to the home over SSH, to the work dir inside a job: never guessed.
    ("cluster:\n  work_dir: jobs\nhosts: [a]\n", ":2: cluster.work_dir has a bad directory "
     "value 'jobs' (fix: start it with / or ~/ (the node user's home), e.g. ~/jobs)"),
    ("cluster:\n  torchrun: venv/bin/torchrun\nhosts: [a]\n", ":2: cluster.torchrun has a "
     "bad program value 'venv/bin/torchrun' (fix: start it with / or ~/ (the node user's "
     "home), e.g. ~/venv/bin/torchrun (or a name on the nodes' PATH))"),
    ("cluster:\n  python: ./py\nhosts: [a]\n", ":2: cluster.python has a bad program"),
    ("cluster:\n  work_dir: ~bob/jobs\nhosts: [a]\n", "~NAME/ is not expanded"),
    ("cluster:\n  rendezvous_port: 22\nhosts: [n1, n2]\n", ":2: cluster.rendezvous_port 22 "
     "is the SSH port of n[1-2] (fix: use a free port, e.g. 29500)"),
    ("slurm:\n  srun_ports: 29000-29999\nhosts: [a]\n", ":2: cluster.rendezvous_port 29500 "
     "is inside slurm.srun_ports 29000-29999 (fix: use a port outside that range"),
    # The ports jobs side by side take (launch --gpus), from rendezvous_port up.
    ("cluster:\n  rendezvous_port: 20\n  rendezvous_ports: 8\nhosts: [n1, n2]\n",
     ":2: cluster.rendezvous_port 20-27 (rendezvous_ports) holds the SSH port of n[1-2]"),
    ("cluster:\n  rendezvous_ports: 8\nslurm:\n  srun_ports: 29505-29999\nhosts: [a]\n",
     "cluster.rendezvous_port 29500-29507 (rendezvous_ports) is inside slurm.srun_ports"),
    ("cluster:\n  rendezvous_port: 65530\n  rendezvous_ports: 8\nhosts: [a]\n",
     ":2: cluster.rendezvous_port 65530-65537 (rendezvous_ports) runs past port 65535"),
    ("cluster:\n  rendezvous_ports: 0\nhosts: [a]\n", "use a whole number from 1 to 64"),
])
def test_single_problems(tmp_path: Path, text: str, expected: str) -> None:
    assert any(expected in p for p in problems(write(tmp_path, text))), problems(
        write(tmp_path, text))


def test_node_paths_from_the_root_or_the_home_and_programs_on_the_path(tmp_path: Path
                                                                     ) -> None:
    loaded = inventory.load(write(tmp_path, "cluster:\n  work_dir: ~/jobs\n"
                                  "  python: ~/v env/bin/python\n  torchrun: torchrun2\n"
                                  "hosts: [a]\n"))
    assert (loaded.cluster.work_dir, loaded.cluster.python, loaded.cluster.torchrun) == (
        "~/jobs", "~/v env/bin/python", "torchrun2")
    assert inventory.load(write(tmp_path, "cluster:\n  work_dir: /srv/jobs\nhosts: [a]\n")
                ).cluster.work_dir == "/srv/jobs"


def test_unparsable_yaml_names_the_line(tmp_path: Path) -> None:
    path = write(tmp_path, "hosts:\n  - name: a\n  bad: [\n")
    (found,) = problems(path)
    assert found.startswith(f"{path}:")
    assert "not valid YAML" in found


def test_missing_directory_and_binary_files(tmp_path: Path) -> None:
    assert "inventory file not found" in problems(tmp_path / "nope.yaml")[0]
    assert "is a directory" in problems(tmp_path)[0]
    binary = tmp_path / "binary.yaml"
    binary.write_bytes(b"hosts:\n  - \xff\xfe\n")
    assert f"{binary}:2: not UTF-8 text" in problems(binary)[0]


def test_unreadable_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = write(tmp_path, "hosts: [a]\n")

    def denied(self: Path) -> bytes:
        raise PermissionError(13, "Permission denied")

    # Root (as in CI) reads any file, so the refusal is simulated at the read itself.
    monkeypatch.setattr(Path, "read_bytes", denied)
    assert problems(path) == [f"{path}: cannot read: Permission denied "
                              f"(fix: check the file's permissions)"]


def test_ssh_config_aliases_resolve_and_explicit_values_win(tmp_path: Path) -> None:
    config = write(tmp_path, """\
Host trainbox
  HostName 10.1.2.3
  User alice
  Port 2222
  IdentityFile ~/.ssh/trainbox_key
  ProxyJump bastion.example.com
Host other
  HostName 10.9.9.9
""", "ssh_config")
    path = write(tmp_path, f"""\
cluster:
  ssh_config: {config}
defaults:
  user: bob
hosts:
  - trainbox
  - name: other
    user: carol
""")
    trainbox, other = inventory.load(path).hosts
    assert (trainbox.address, trainbox.user, trainbox.port) == ("10.1.2.3", "alice", 2222)
    assert trainbox.identity_file == str(Path("~/.ssh/trainbox_key").expanduser())
    assert trainbox.jump_host == "bastion.example.com"
    assert (other.address, other.user) == ("10.9.9.9", "carol")


def test_relative_paths_are_relative_to_the_inventory(tmp_path: Path) -> None:
    (tmp_path / "sub").mkdir()
    path = write(tmp_path / "sub", "cluster:\n  known_hosts: kh\ndefaults:\n"
                 "  identity_file: keys/id\nhosts: [a]\n")
    loaded = inventory.load(path)
    assert loaded.cluster.known_hosts == str(tmp_path / "sub" / "kh")
    assert loaded.hosts[0].identity_file == str(tmp_path / "sub" / "keys" / "id")


def test_selection_by_range_and_group(tmp_path: Path) -> None:
    loaded = inventory.load(write(tmp_path, "groups:\n  odd: ['n[1,3]']\nhosts:\n"
                                  "  - name: n[1-4]\n    groups: [all]\n"))
    assert [h.name for h in loaded.select("n[2-3]")] == ["n2", "n3"]
    assert [h.name for h in loaded.select(group="odd")] == ["n1", "n3"]
    assert [h.name for h in loaded.select(group="all")] == ["n1", "n2", "n3", "n4"]
    assert loaded.host("n1").groups == ("all", "odd")
    with pytest.raises(GpuclusterError, match="unknown hosts: n9"):
        loaded.select("n9")
    with pytest.raises(GpuclusterError, match="no group 'even'"):
        loaded.select(group="even")
    # `-w "$NODES"` with the variable empty ran on nothing and said nothing, exit 0
    with pytest.raises(GpuclusterError, match=r"--hosts '' names no host \(fix: "):
        loaded.select("")
    with pytest.raises(GpuclusterError, match=r"--group '' names no group \(fix: "):
        loaded.select(group="")
    # An unclosed bracket was no piece of the list at all: "names no host", not the typo
    for typo in ("n[1-", "n1],n2"):
        with pytest.raises(GpuclusterError, match=rf"^--hosts '{re.escape(typo)}': unbalanced "
                                                  rf"brackets .*\(fix: close each \["):
            loaded.select(typo)
    with pytest.raises(GpuclusterError, match=r"no host is both in --hosts n2 and in group "
                                              r"'odd' \(fix: "):
        loaded.select("n2", group="odd")
    with pytest.raises(GpuclusterError, match=r"no group 'od'.*did you mean odd\?"):
        loaded.select(group="od")
    bare = inventory.load(write(tmp_path, "hosts: [a]\n"))
    with pytest.raises(GpuclusterError, match=r"groups: none defined; fix: .*groups:"):
        bare.select(group="gpu")


def test_find_inventory_precedence(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv(inventory.INVENTORY_ENV_VAR, raising=False)
    with pytest.raises(GpuclusterError) as caught:
        inventory.find_inventory(None)
    message = str(caught.value)
    assert "-i/--inventory" in message and "$GPUCLUSTER_INVENTORY" in message
    assert "./inventory.yaml" in message
    write(tmp_path, "hosts: [a]\n")
    assert inventory.find_inventory(None) == Path("inventory.yaml")
    from_env = write(tmp_path, "hosts: [a]\n", "from-env.yaml")
    monkeypatch.setenv(inventory.INVENTORY_ENV_VAR, str(from_env))
    assert inventory.find_inventory(None) == from_env
    assert inventory.find_inventory("explicit.yaml") == Path("explicit.yaml")
    # A path in the variable that is not there names the variable, not -i.
    monkeypatch.setenv(inventory.INVENTORY_ENV_VAR, "/from/env.yaml")
    with pytest.raises(GpuclusterError, match=r"^/from/env.yaml: inventory file not found, "
                       r"named by \$GPUCLUSTER_INVENTORY \(fix: point \$GPUCLUSTER_INVENTORY"):
        inventory.find_inventory(None)


def _load_or_our_error(path: Path) -> None:
    try:
        result = inventory.load(path)
    except InventoryError as error:
        assert error.problems
        for problem in error.problems:
            assert str(problem).startswith(str(path))
    else:
        assert isinstance(result, inventory.Inventory)


yaml_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda children: st.lists(children, max_size=4)
    | st.dictionaries(st.sampled_from(["hosts", "name", "address", "port", "cluster",
                                       "defaults", "groups", "env", "gpus", "x"])
                      | st.text(max_size=8), children, max_size=4),
    max_leaves=12)


@settings(max_examples=150, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(value=yaml_values)
def test_arbitrary_yaml_documents(tmp_path: Path, value: object) -> None:
    import yaml

    path = tmp_path / "fuzz.yaml"
    path.write_text(yaml.safe_dump(value))
    _load_or_our_error(path)


@settings(max_examples=200, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.binary(max_size=300) | st.text(max_size=300).map(str.encode))
def test_arbitrary_bytes(tmp_path: Path, data: bytes) -> None:
    path = tmp_path / "fuzz.yaml"
    path.write_bytes(data)
    _load_or_our_error(path)


def test_torch_device_cpu_means_jobs_leave_the_gpus_alone(tmp_path: Path) -> None:
    from gpucluster.nproc import nproc_for

    path = tmp_path / "inventory.yaml"
    path.write_text("defaults: {gpus: 8}\nhosts:\n  - a\n  - name: b\n    torch_device: cpu\n")
    loaded = inventory.load(path)
    assert loaded.host("a").jobs_use_gpus and nproc_for(loaded.host("a"), None) == 8
    assert not loaded.host("b").jobs_use_gpus and nproc_for(loaded.host("b"), None) == 1
    path.write_text("hosts:\n  - name: a\n    torch_device: rocm\n")
    with pytest.raises(InventoryError) as error:
        inventory.load(path)
    assert "torch_device" in str(error.value) and "use cuda or cpu" in str(error.value)


@pytest.mark.parametrize("name", ["é", "FOO\n", "1A", "A-B", "", "A B"])
def test_environment_names_follow_one_rule_everywhere(name: str, tmp_path: Path) -> None:
    from gpucluster.env_names import is_env_name
    from gpucluster.remote.connection import build_command

    assert not is_env_name(name)
    with pytest.raises(ValueError, match="not a valid environment variable name"):
        build_command("true", {name: "v"}, sudo=False, is_root=True)
    path = tmp_path / "inventory.yaml"
    path.write_text(f"cluster:\n  env: {{{name!r}: v}}\nhosts: [a]\n".replace("'", '"'))
    with pytest.raises(InventoryError, match="not a valid environment variable name"):
        inventory.load(path)


def test_a_plain_environment_name_is_accepted() -> None:
    from gpucluster.env_names import is_env_name

    assert is_env_name("_NCCL_DEBUG2") and is_env_name("a")


def test_the_state_dir_keeps_itself_out_of_git(tmp_path: Path) -> None:
    from gpucluster.state import state_dir_for

    path = tmp_path / "inventory.yaml"
    path.write_text("hosts: [a]\n")
    state = state_dir_for(inventory.load(path))
    assert state == tmp_path / ".gpucluster" and state.stat().st_mode & 0o777 == 0o700
    assert (state / ".gitignore").read_text().splitlines()[-1] == "*"


def test_a_state_dir_that_cannot_be_made_is_one_line_with_the_fix(tmp_path: Path) -> None:
    from tests.cli import gpucluster

    (tmp_path / "inventory.yaml").write_text(
        "hosts:\n  - {name: a, address: 127.0.0.1, connection: local}\n")
    (tmp_path / ".gpucluster").write_text("")  # a file where the directory would be
    listed = gpucluster("jobs", "-i", str(tmp_path / "inventory.yaml"))
    assert listed.code == 2 and "Traceback" not in listed.stderr, listed.stderr
    assert listed.stderr.strip() == (
        f"gpucluster: error: {tmp_path}/.gpucluster: cannot keep gpucluster's state there: "
        f"File exists (fix: it lives beside the inventory: make {tmp_path} writable, or "
        f"copy inventory.yaml to a directory you can write)")


@pytest.mark.parametrize("entry", [
    "{name: tunnel, address: 127.0.0.1, port: 2222}",
    "{name: asuser, address: localhost, user: admin}",
    "{name: withkey, address: '::1', identity_file: /k}",
    "{name: viaalias, address: loopalias}",
])
def test_loopback_means_this_machine_only_when_nothing_says_otherwise(
        tmp_path: Path, entry: str) -> None:
    config = tmp_path / "ssh_config"
    config.write_text("Host loopalias\n  HostName 127.0.0.1\n  Port 2299\n")
    path = write(tmp_path, f"cluster: {{ssh_config: {config}}}\nhosts:\n  - {entry}\n")
    host = inventory.load(path).hosts[0]
    assert not host.is_local and host.connection == "ssh"  # host keys are checked
    bare = inventory.load(write(tmp_path, f"cluster: {{ssh_config: {config}}}\n"
                                          f"hosts: [localhost, 127.0.0.1]\n"))
    assert all(h.is_local for h in bare.hosts)


def test_trailing_newlines_do_not_pass_validation(tmp_path: Path) -> None:
    path = write(tmp_path, 'hosts:\n  - "gpu01\\n"\n')
    with pytest.raises(InventoryError, match="characters a hostname cannot"):
        inventory.load(path)


def test_a_job_record_must_carry_its_directorys_id(tmp_path: Path) -> None:
    import json

    from gpucluster.launch.jobs import JobStore

    store = JobStore(tmp_path)
    directory = store.directory("20261130-120000-abcd")
    directory.mkdir(parents=True)
    record = {"id": "20261130-120000-abcd; rm -rf /", "script": "t.py", "args": [],
              "hosts": ["a"], "code_dir": "x", "jobs_dir": "y", "started_at": 0.0,
              "nproc_per_node": {"a": 1}}
    (directory / "job.json").write_text(json.dumps(record))
    with pytest.raises(GpuclusterError, match="is not its directory's name"):
        store.load(None)
    (store.root / "20261130-120000-abcd\n").mkdir()  # a name with a newline is no job
    assert store.ids() == ["20261130-120000-abcd"]


def test_secrets_stay_out_of_reprs_and_inventory_output(tmp_path: Path) -> None:
    from gpucluster.cli.views.inventory import hosts_payload
    from gpucluster.remote.ssh import SshOptions

    assert "hunter2" not in repr(SshOptions(tmp_path / "kh", password="hunter2"))
    path = write(tmp_path, "cluster:\n  env: {HF_TOKEN: hf_x1, WANDB_API_KEY: k2, "
                           "NCCL_DEBUG: INFO}\nhosts: [a]\n")
    env = hosts_payload(inventory.load(path))["cluster"]["env"]
    assert env == {"HF_TOKEN": "***", "WANDB_API_KEY": "***", "NCCL_DEBUG": "INFO"}


def test_a_huge_product_of_ranges_is_refused_before_it_is_built(tmp_path: Path) -> None:
    import tracemalloc

    tracemalloc.start()
    with pytest.raises(InventoryError, match="expands to too many names"):
        inventory.load(write(tmp_path, "hosts:\n  - n[1-50000]x[1-50000]\n"))
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert peak < 200 * 1024 * 1024  # building the product first took gigabytes


def test_yaml_anchors_and_merge_keys_give_each_host_its_own_copy(tmp_path: Path) -> None:
    """Anchors and `<<:` merges, as docker-compose files use them, were refused ("YAML
    aliases are not allowed ... fix the YAML syntax": valid YAML called invalid). A key of
    the host's own overrides a merged one; its own key written twice is still an error."""
    text = ("defaults:\n  labels: &labels {rack: b}\n"
            "hosts:\n"
            "  - &gpu\n    name: gpu01\n    user: ubuntu\n    gpus: 8\n"
            "    labels: {rack: a}\n"
            "  - <<: *gpu\n    name: gpu02\n    gpus: 4\n"
            "  - {<<: *gpu, name: gpu03, labels: *labels}\n")
    loaded = inventory.load(write(tmp_path, text))
    hosts = {h.name: h for h in loaded.hosts}
    assert {n: (h.user, h.gpus) for n, h in hosts.items()} == {
        "gpu01": ("ubuntu", 8), "gpu02": ("ubuntu", 4), "gpu03": ("ubuntu", 8)}
    assert {n: h.labels for n, h in hosts.items()} == {
        "gpu01": {"rack": "a"}, "gpu02": {"rack": "a"}, "gpu03": {"rack": "b"}}
    with pytest.raises(InventoryError, match=r":12: key 'gpus' appears twice"):
        inventory.load(write(tmp_path, text.replace("    gpus: 4\n",
                                                    "    gpus: 4\n    gpus: 2\n")))


def test_yaml_aliases_that_expand_without_bound_are_refused_at_their_line(
        tmp_path: Path) -> None:
    import tracemalloc

    laughs = "a0: &a0 [lol, lol, lol, lol, lol, lol, lol, lol, lol, lol]\n" + "".join(
        f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]\n" for i in range(1, 10)
    ) + "hosts: [n1]\n"
    tracemalloc.start()
    with pytest.raises(InventoryError) as error:
        inventory.load(write(tmp_path, laughs))
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert ":5: the aliases up to here expand to more than 100000 values (fix: write " \
        "the values out, or nest fewer aliases)" in str(error.value)
    assert peak < 100 * 1024 * 1024
    with pytest.raises(InventoryError, match=r":1: the alias \*h is inside its own anchor"):
        inventory.load(write(tmp_path, "hosts: &h [n1, *h]\n"))
    with pytest.raises(InventoryError, match=r":1: the alias \*g has no anchor &g above it "
                                             r"\(fix: mark the value to repeat with &g"):
        inventory.load(write(tmp_path, "hosts: [*g]\n"))


def test_a_second_launch_from_beside_the_same_inventory_is_refused(tmp_path: Path) -> None:
    import subprocess
    import sys

    from gpucluster.state import exclusive

    holder = subprocess.Popen([sys.executable, "-c", (
        "import sys, time; from pathlib import Path; from gpucluster.state import exclusive\n"
        f"with exclusive(Path({str(tmp_path)!r}), 'launch'):\n"
        "    print('held', flush=True); time.sleep(30)")], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        with pytest.raises(GpuclusterError, match="another gpucluster launch"), \
                exclusive(tmp_path, "launch"):
            pass
        with exclusive(tmp_path, "provision"):  # another kind of work is not blocked
            pass
    finally:
        holder.kill()
        holder.wait()
    with exclusive(tmp_path, "launch"):  # released with the process that held it
        pass


def test_ssh_config_gives_every_identity_file_its_proxy_command_and_timeout(
        tmp_path: Path) -> None:
    config = tmp_path / "ssh_config"
    config.write_text("Host gpu1\n  HostName 10.0.0.1\n  IdentityFile ~/.ssh/a\n"
                      "  IdentityFile ~/.ssh/b\n  ProxyCommand ssh -W %h:%p bastion\n"
                      "  ConnectTimeout 7\n"
                      "Host gpu2\n  IdentityFile ~/.ssh/a\n  ProxyCommand none\n")
    path = write(tmp_path, f"cluster: {{ssh_config: {config}}}\nhosts:\n  - gpu1\n"
                           f"  - gpu2\n  - {{name: gpu3, address: gpu1, port: 2222, "
                           f"identity_file: /k}}\n")
    gpu1, gpu2, gpu3 = inventory.load(path).hosts
    assert gpu1.identity_files == (str(Path("~/.ssh/a").expanduser()),
                                   str(Path("~/.ssh/b").expanduser()))
    assert gpu1.proxy_command == "ssh -W 10.0.0.1:22 bastion"
    assert gpu1.connect_timeout == 7.0 and not gpu1.is_local
    assert gpu2.proxy_command is None and gpu2.connect_timeout is None
    assert gpu3.identity_files == ("/k",)  # the inventory's key alone


def test_a_selection_keeps_left_out_hosts_as_jump_hosts(tmp_path: Path) -> None:
    from gpucluster.remote.session import Session
    from gpucluster.remote.ssh import SshOptions

    path = write(tmp_path, "hosts:\n  - {name: bastion, address: 10.0.0.1, user: jump}\n"
                           "  - {name: gpu1, address: 10.0.0.2, jump_host: bastion}\n")
    loaded = inventory.load(path)
    selected = loaded.restricted_to(loaded.select("gpu1"))
    assert [h.name for h in selected.hosts] == ["gpu1"] and selected.head.name == "gpu1"
    jump = Session(selected, SshOptions(tmp_path / "kh"))._jump_endpoint("bastion")
    assert (jump.address, jump.user) == ("10.0.0.1", "jump")  # not an ssh_config guess


def test_every_problem_is_listed_in_file_order(tmp_path: Path) -> None:
    """The checks run section by section (cluster before hosts); the list reads as the
    file does."""
    path = tmp_path / "inventory.yaml"
    path.write_text("hosts:\n  - name: n1\n    adress: 10.0.0.1\n    gpu: 8\n"
                    "cluster:\n  rendezvous_prot: 29500\n")
    with pytest.raises(InventoryError) as caught:
        inventory.load(path)
    assert [p.line for p in caught.value.problems] == [3, 4, 6]
    assert [line.split(":")[1] for line in str(caught.value).splitlines()] == ["3", "4", "6"]


@pytest.mark.parametrize("match_exec", [False, True])
def test_paramiko_comes_without_invoke_unless_the_ssh_config_runs_match_exec(
        tmp_path: Path, match_exec: bool) -> None:
    """paramiko imports invoke (Fabric's task runner, a dependency of paramiko) as it is
    imported, for `Match exec` alone: 0.1 s of every command's start-up. The CLI leaves
    it out until an ssh config has a `Match exec`, which then still works. A fresh
    interpreter each, as the CLI is."""
    import subprocess
    import sys

    config = tmp_path / "ssh_config"
    config.write_text('Match exec "true"\n  HostName 10.2.2.2\n' if match_exec else
                      "Host box\n  HostName 10.1.1.1\n")
    code = ("import sys\nfrom gpucluster import ssh_config\nssh_config.leave_out_invoke()\n"
            "config = ssh_config.SshConfig(sys.argv[1])\nimport paramiko\n"
            "print(sys.modules.get('invoke') is not None, config.lookup('box').hostname)\n")
    done = subprocess.run([sys.executable, "-c", code, str(config)], capture_output=True,
                          text=True, check=False, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == (["True", "10.2.2.2"] if match_exec else
                                   ["False", "10.1.1.1"])
