"""Doctor's checks on synthetic facts (the probe's section format), its runner's error
handling, and the real probe script run on this machine."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpucluster import inventory as inventory_module
from gpucluster import reports
from gpucluster.doctor import probe
from gpucluster.doctor.model import (
    REGISTRY,
    CheckResult,
    CheckSpec,
    Context,
    Status,
    majority,
    parity,
)
from gpucluster.doctor.runner import _run_check
from gpucluster.remote.local import LocalConnection

GPU_HEADER = ("index, name, uuid, pci.bus_id, driver_version, memory.total [MiB], "
              "persistence_mode, mig.mode.current, ecc.mode.current, "
              "ecc.errors.uncorrected.volatile.total, ecc.errors.uncorrected.aggregate.total, "
              "retired_pages.pending, remapped_rows.pending, remapped_rows.failure, "
              "fabric.state, fabric.status, clocks_event_reasons.active")


def gpu_row(index: int = 0, **overrides: str) -> str:
    cells = {"name": "NVIDIA H100 80GB HBM3", "persistence": "Enabled", "mig": "Disabled",
             "ecc": "Enabled", "volatile": "0", "aggregate": "0", "retired": "[N/A]",
             "pending": "No", "failure": "No", "fabric": "Completed", "status": "Success",
             "driver": "550.54.15", "events": "0x0000000000000001", **overrides}
    return (f"{index}, {cells['name']}, GPU-{index}, 00000000:{index + 24:02X}:00.0, "
            f"{cells['driver']}, 81559 MiB, {cells['persistence']}, {cells['mig']}, "
            f"{cells['ecc']}, {cells['volatile']}, {cells['aggregate']}, {cells['retired']}, "
            f"{cells['pending']}, {cells['failure']}, {cells['fabric']}, {cells['status']}, "
            f"{cells['events']}")


def facts(gpus: list[str] | None = None, torch: str = '{"torch": "2.5.1", "cuda": "12.4", '
          '"nccl": "2.21.5"}', cuda: str = "12.4", hostname: str = "n", offset: float = 0.0,
          **sections: str) -> probe.NodeFacts:
    parts = {"hostname": hostname, "python": "/opt/venv/bin/python", "torch": torch,
             "nvidia_smi_path": "/usr/bin/nvidia-smi", "sudo": "root", "memlock": "unlimited",
             "nvidia_version": f"DRIVER version : 550.54.15\nCUDA Version : {cuda}",
             "gpus": "\n".join([GPU_HEADER, *(gpus if gpus is not None else [gpu_row()])]),
             "shm": "shm 16777216 0 16777216 0% /dev/shm", **sections}
    output = "".join(f"@@gpc section {name}\n{text}\n@@gpc end 0\n"
                     for name, text in parts.items())
    clock = f"@@gpc section clock\n{time.time() + offset}\n@@gpc end 0\n"
    return probe.parse_facts(output + clock, time.time())


def context(tmp_path: Path, node_facts: dict[str, probe.NodeFacts],
            extra: str = "") -> Context:
    path = tmp_path / "inventory.yaml"
    names = ", ".join(node_facts)
    path.write_text(f"defaults:\n  gpus: 1\n{extra}hosts: [{names}]\n")
    return Context(inventory_module.load(path), node_facts, {}, {})


def statuses(check: str, ctx: Context) -> dict[str, Status]:
    return {r.host: r.status for r in REGISTRY[check].run(ctx)}


def test_torch_built_for_a_newer_cuda_major_than_the_driver_fails(tmp_path: Path) -> None:
    ctx = context(tmp_path, {"a": facts(cuda="11.8"), "b": facts()})
    results = {r.host: r for r in REGISTRY["torch-cuda"].run(ctx)}
    assert results["a"].status is Status.FAIL
    assert "CUDA 12.4, the driver supports only 11.8" in results["a"].message
    assert results["b"].status is Status.OK


def test_a_missing_torchrun_gets_the_fix_for_how_the_inventory_names_it(
        tmp_path: Path) -> None:
    found = facts(torchrun="/opt/venv/bin/torchrun")
    missing = facts(path="/usr/bin:/bin")  # no torchrun section: command -v found nothing
    by_name = {r.host: r for r in REGISTRY["torchrun"].run(
        context(tmp_path, {"a": found, "b": missing}))}
    assert by_name["a"].status is Status.OK and by_name["b"].status is Status.FAIL
    assert "'torchrun' not found in a non-interactive SSH session" in by_name["b"].message
    assert "set cluster.torchrun in the inventory to the absolute path" in by_name["b"].remedy
    assert by_name["b"].details == {"PATH": "/usr/bin:/bin"}
    # A path is the file itself: PATH plays no part, so the fix is the file
    [by_path] = REGISTRY["torchrun"].run(context(
        tmp_path, {"b": missing}, "cluster:\n  torchrun: /opt/venv/bin/torchrun\n"))
    assert by_path.status is Status.FAIL
    assert by_path.message == "/opt/venv/bin/torchrun (cluster.torchrun) is missing or not " \
                              "executable"
    assert "PATH" not in by_path.remedy and "set cluster.torchrun to where" in by_path.remedy


# torch's version.py as its CPU and CUDA wheels write it (grep'd by the probe).
CPU_BUILD = "__version__ = '2.13.0+cpu'\ncuda: Optional[str] = None"
CUDA_BUILD = "__version__ = '2.5.1+cu124'\ncuda: Optional[str] = '12.4'"


def test_cpu_torch_on_a_gpu_node_fails_except_in_the_sandbox(tmp_path: Path) -> None:
    cpu = facts(torch='{"torch": "2.13.0+cpu", "cuda": null, "nccl": null}',
                torch_build=CPU_BUILD)
    [failed] = REGISTRY["torch-build"].run(context(tmp_path, {"a": cpu}))
    assert failed.status is Status.FAIL
    assert failed.message == ("torch 2.13.0+cpu is a CPU-only build on an NVIDIA GPU node: a "
                              "job's ranks would find no GPU")
    assert "python3 -m pip install torch --index-url https://download.pytorch.org/whl/cu124" \
        in failed.remedy and "torch_device: cpu" in failed.remedy
    # torch-cuda leaves the build to torch-build: one finding, not two
    assert statuses("torch-cuda", context(tmp_path, {"a": cpu})) == {"a": Status.SKIP}
    sandbox = context(tmp_path, {"a": cpu}, "  torch_device: cpu\n")
    assert statuses("torch-build", sandbox) == {"a": Status.SKIP}
    [built] = REGISTRY["torch-build"].run(context(tmp_path, {"a": facts(
        torch_build=CUDA_BUILD)}))
    assert (built.status, built.message) == (Status.OK, "torch 2.5.1+cu124, built for CUDA 12.4")
    rocm = "__version__ = '2.5.1+rocm6.2'\ncuda: Optional[str] = None\nhip: Optional[str] = " \
        "'6.2.41133-dd7f95766'"
    [amd] = REGISTRY["torch-build"].run(context(tmp_path, {"a": facts(torch_build=rocm)}))
    assert (amd.status, amd.message) == (Status.FAIL, "torch 2.5.1+rocm6.2 is a ROCm build "
                                         "(HIP 6.2.41133-dd7f95766), for AMD GPUs, on an "
                                         "NVIDIA GPU node: a job's ranks would find no GPU")
    # No torch found (an empty section), or a version.py naming no `cuda`: no evidence
    for unread in ("", "__version__ = '2.5.1'"):
        ctx = context(tmp_path, {"a": facts(torch_build=unread)})
        assert statuses("torch-build", ctx) == {"a": Status.SKIP}


def test_the_probe_reads_torchs_build_as_torch_itself_says_it(tmp_path: Path) -> None:
    """The probe greps version.py where find_spec finds torch, importing nothing; what it
    reads must be what an import of this machine's torch answers."""
    path = tmp_path / "inventory.yaml"
    path.write_text(f"cluster:\n  python: {sys.executable}\nhosts: [localhost]\n")
    loaded = inventory_module.load(path)
    script = probe.render_probe(loaded, frozenset({"python", "torch_build"}))
    result = LocalConnection("localhost").run(script, timeout=60)
    build = probe.parse_facts(result.stdout, time.time()).torch_build
    imported = subprocess.run(
        [sys.executable, "-c", "import torch; print(torch.__version__, torch.version.cuda)"],
        capture_output=True, text=True, check=True, timeout=120).stdout.split()
    assert build is not None and [build.version, str(build.cuda)] == imported


def test_a_job_whose_torchrun_is_gone_is_named_as_leftovers_not_as_running(
        tmp_path: Path) -> None:
    """doctor (and launch's refusal) said `job X still running`, fix `let it finish`, of
    processes a killed torchrun left, which never finish by themselves."""
    path = tmp_path / "inventory.yaml"
    path.write_text(f"cluster:\n  work_dir: {tmp_path / 'work'}\nhosts: [localhost]\n")
    live, left = f"t{os.getpid()}-live", f"t{os.getpid()}-left"
    started = {job: subprocess.Popen(["sleep", "60"], env={
        **os.environ, "GPUCLUSTER_JOB": f"{job}@localhost",
        "CUDA_VISIBLE_DEVICES": "4, 5"}) for job in (live, left)}
    try:
        for job, leader in ((live, started[live].pid), (left, 2 ** 22 + 1)):  # none such
            (tmp_path / "work" / "jobs" / job / "localhost").mkdir(parents=True)
            (tmp_path / "work" / "jobs" / job / "localhost" / "leader.pid").write_text(
                f"{leader}\n")
        script = probe.render_probe(inventory_module.load(path), frozenset({"jobs"}))
        output = LocalConnection("localhost").run(script, timeout=60).stdout
    finally:
        for process in started.values():
            process.kill()
            process.wait()
    found = probe.parse_facts(output, time.time()).jobs_here("localhost")
    assert (found[live], found[left]) == ("running", "ended"), found
    # A running job's GPUs (launch --gpus), from its leader: one beside it may take others.
    assert probe.parse_facts(output, time.time()).job_gpus_here("localhost") == {live: "4,5"}
    said = facts(jobs=f"GPUCLUSTER_JOB={live}@a running\nGPUCLUSTER_JOB={left}@a ended\n"
                      f"GPUCLUSTER_JOB={left}@b ended\nGPUCLUSTER_JOB=old@c")
    results = {r.host: r for r in REGISTRY["jobs"].run(
        context(tmp_path, {"a": said, "b": said, "c": said}))}
    assert results["a"].message == (f"job {live} still running; job {left} left processes "
                                    f"behind (its torchrun ended)")
    assert results["a"].remedy.startswith(f"let it finish, or end it: gpucluster stop {live}")
    assert results["b"].message == f"job {left} left processes behind (its torchrun ended)"
    assert results["b"].remedy == f"end them: gpucluster stop {left} (gpucluster jobs lists them)"
    assert results["c"].message == "job old still running"  # a probe's line of before
    # A smoke test has no record for stop to find: it is named as one, left to finish.
    smoke = facts(jobs="GPUCLUSTER_JOB=gpucluster-smoke-0123abcd@a running -\n")
    (result,) = REGISTRY["jobs"].run(context(tmp_path, {"a": smoke}))
    assert (result.status, result.message) == (
        Status.WARN, "a smoke test runs here (gpucluster-smoke-0123abcd)")
    assert result.remedy == ("let the smoke test finish: it ends within its --timeout "
                             "(300 s unless given)")


def test_a_smoke_tests_gpu_processes_are_its_own_not_leftovers_to_reap(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The probe, run here, with an nvidia-smi listing a smoke test's rank: it has no job
    dir, and was read as a job whose torchrun had ended, its fix `gpucluster reap --yes`
    (which would have ended the running test). It is a smoke test, left to finish."""
    path = tmp_path / "inventory.yaml"
    path.write_text(f"cluster:\n  work_dir: {tmp_path / 'work'}\nhosts: [localhost]\n")
    rank = subprocess.Popen(["sleep", "60"], env={
        **os.environ, "GPUCLUSTER_JOB": "gpucluster-smoke-0123abcd@localhost"})
    tools = tmp_path / "bin"
    tools.mkdir()
    (tools / "nvidia-smi").write_text(
        "#!/bin/sh\necho 'gpu_bus_id, pid, process_name, used_gpu_memory [MiB]'\n"
        f"echo '00000000:18:00.0, {rank.pid}, python3, 239'\n")
    (tools / "nvidia-smi").chmod(0o755)
    monkeypatch.setenv("PATH", f"{tools}:{os.environ['PATH']}")
    try:
        script = probe.render_probe(inventory_module.load(path), frozenset({"app_jobs"}))
        output = LocalConnection("localhost").run(script, timeout=60).stdout
    finally:
        rank.kill()
        rank.wait()
    assert f"{rank.pid} gpucluster-smoke-0123abcd running" in output, output
    found = probe.parse_facts(output, time.time()).sections
    said = facts(apps=found["apps"].output, app_jobs=found["app_jobs"].output)
    (result,) = REGISTRY["gpu-processes"].run(context(tmp_path, {"a": said}))
    assert (result.message, result.remedy.split(";")[0]) == (
        "GPUs held by a smoke test (gpucluster-smoke-0123abcd, 1 process)",
        "let it finish: it ends within its --timeout (300 s unless given)")


def test_torch_and_nccl_parity(tmp_path: Path) -> None:
    other = '{"torch": "2.4.0", "cuda": "12.4", "nccl": "2.20.5"}'
    ctx = context(tmp_path, {"a": facts(), "b": facts(), "c": facts(torch=other)})
    assert statuses("torch", ctx) == {"a": Status.OK, "b": Status.OK, "c": Status.FAIL}
    assert statuses("nccl", ctx)["c"] is Status.FAIL
    broken = '{"torch": null, "error": "ImportError: libcudnn.so.9"}'
    ctx = context(tmp_path, {"a": facts(torch=broken)})
    (result,) = REGISTRY["torch"].run(ctx)
    assert result.status is Status.FAIL and "libcudnn" in result.message


@pytest.mark.parametrize(("check", "overrides", "expected"), [
    ("ecc", {"volatile": "3"}, Status.FAIL),
    ("ecc", {"aggregate": "1"}, Status.WARN),
    ("ecc", {"ecc": "[N/A]", "volatile": "[N/A]", "aggregate": "[N/A]"}, Status.SKIP),
    ("row-remapping", {"pending": "Yes"}, Status.FAIL),
    ("row-remapping", {"failure": "Yes"}, Status.FAIL),
    ("retired-pages", {"retired": "Yes"}, Status.FAIL),
    ("persistence", {"persistence": "Disabled"}, Status.WARN),
    ("mig", {"mig": "Enabled"}, Status.WARN),
    ("fabric", {"fabric": "In Progress", "status": "N/A"}, Status.FAIL),
    ("fabric", {"fabric": "N/A", "status": "N/A"}, Status.SKIP),
    ("clocks", {"events": "0x0000000000000041"}, Status.FAIL),  # idle, and too hot
    ("clocks", {"events": "0x0000000000000020"}, Status.WARN),  # software thermal
    ("clocks", {"events": "0x0000000000000004"}, Status.OK),  # the power cap: a busy GPU's
])
def test_gpu_health(tmp_path: Path, check: str, overrides: dict[str, str],
                    expected: Status) -> None:
    ctx = context(tmp_path, {"a": facts(gpus=[gpu_row(0), gpu_row(1, **overrides)])})
    results = REGISTRY[check].run(ctx)
    assert [r.status for r in results] == [expected]
    if expected in (Status.WARN, Status.FAIL):
        assert results[0].message.startswith("GPU 1:") and results[0].remedy


def test_gpus_that_say_the_same_are_listed_once(tmp_path: Path) -> None:
    hot = "0x0000000000000040"
    rows = [gpu_row(0, events=hot), gpu_row(1, events=hot), gpu_row(2),
            gpu_row(3, events=hot), gpu_row(4, events="0x0000000000000088")]
    [result] = REGISTRY["clocks"].run(context(tmp_path, {"a": facts(gpus=rows)}))
    assert result.message == "GPU 0-1,3: clocks held down: hw_thermal; " \
                             "GPU 4: clocks held down: hw_slowdown+hw_power_brake"
    assert set(result.details["gpus"]) == {"0", "1", "3", "4"}  # each GPU still there


def test_system_limits(tmp_path: Path) -> None:
    small = facts(shm="shm 65536 0 65536 0% /dev/shm", memlock="64",
                  infiniband="mlx5_0/1 4: ACTIVE|400 Gb/sec (4X NDR)", offset=5.0,
                  disk="/dev/vda 1000 900 100 90% /")
    ctx = context(tmp_path, {"a": small})
    assert statuses("shm", ctx) == {"a": Status.WARN}
    assert statuses("memlock", ctx) == {"a": Status.WARN}
    assert statuses("clock", ctx) == {"a": Status.WARN}
    assert statuses("disk", ctx) == {"a": Status.FAIL}
    assert statuses("infiniband", ctx) == {"a": Status.OK}
    relaxed = context(tmp_path, {"a": facts(memlock="64")})
    assert statuses("memlock", relaxed) == {"a": Status.OK}  # no InfiniBand: no need


def test_infiniband_down_port_and_parity(tmp_path: Path) -> None:
    ctx = context(tmp_path, {
        "a": facts(infiniband="mlx5_0/1 4: ACTIVE|400 Gb/sec (4X NDR)"),
        "b": facts(infiniband="mlx5_0/1 1: DOWN|10 Gb/sec (4X SDR)"),
        "c": facts()})
    assert statuses("infiniband", ctx) == {"a": Status.OK, "b": Status.FAIL, "c": Status.FAIL}


def test_gpu_count_against_inventory_and_peers(tmp_path: Path) -> None:
    ctx = context(tmp_path, {"a": facts(), "b": facts(gpus=[])})
    results = {r.host: r for r in REGISTRY["gpu-count"].run(ctx)}
    assert results["b"].status is Status.FAIL
    assert results["b"].message == "0 GPUs found, inventory expects 1"


def test_majority_and_parity() -> None:
    assert majority({"a": 1, "b": 1, "c": 2}) == 1
    assert majority({"a": 1, "b": 2}) is None
    tie = parity("x", {"a": "1", "b": "2"}, Status.FAIL, "v", "fix")
    assert [r.status for r in tie] == [Status.FAIL, Status.FAIL]
    assert "1 on a; 2 on b" in tie[0].message
    same = parity("x", {"a": "1", "b": "1"}, Status.FAIL, "v", "fix")
    assert same[0].message == "v 1 (same on all 2 nodes)"
    alone = parity("x", {"a": "1"}, Status.FAIL, "v", "fix")  # a one-server cluster
    assert [(r.status, r.message) for r in alone] == [(Status.OK, "v 1")]


def test_a_check_that_raises_becomes_fail_with_the_error(tmp_path: Path) -> None:
    def broken(_ctx: Context) -> list:
        raise ZeroDivisionError("boom")

    ctx = context(tmp_path, {"a": facts()})
    (result,) = _run_check(CheckSpec("broken", "x", "x", broken), ctx)
    assert result.status is Status.FAIL and "ZeroDivisionError" in result.details["error"]


def test_sections_survive_garbage_and_truncation() -> None:
    output = ("noise\n@@gpc section a\nline1\n@@gpc end 0\n@@gpc end x\n"
              "@@gpc section b\npartial")  # b never ended
    assert reports.sections(output) == {"a": reports.Section("line1", 0)}


def test_the_real_probe_runs_here_and_quotes_inventory_paths(tmp_path: Path) -> None:
    target = tmp_path / "pwned"
    path = tmp_path / "inventory.yaml"
    path.write_text(f"cluster:\n  python: '/usr/bin/python3; touch {target}'\n"
                    f"  work_dir: '~/no such dir/$(touch {target})'\nhosts: [localhost]\n")
    loaded = inventory_module.load(path)
    sent = time.time()
    result = LocalConnection("localhost").run(probe.render_probe(loaded), timeout=60)
    found = probe.parse_facts(result.stdout, sent)
    assert not target.exists()
    for section in ("hostname", "user", "sudo", "path", "python", "torch", "shm", "memlock",
                    "disk", "runtimes", "xid", "addresses"):
        assert section in found.sections, section
    assert found.ok_text("python") is None  # the odd path is looked up literally
    assert found.df_available_bytes("disk") is not None  # nearest existing parent
    assert found.clock_offset_s is not None and abs(found.clock_offset_s) < 5


def test_paths_from_the_home_are_the_node_users_wherever_gpucluster_was_started(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    home = tmp_path / "home"
    tools = home / "v env" / "bin"
    tools.mkdir(parents=True)
    for name in ("python", "torchrun"):
        (tools / name).write_text("#!/bin/sh\n")
        (tools / name).chmod(0o755)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(tmp_path)
    path = tmp_path / "inventory.yaml"
    path.write_text("cluster:\n  python: ~/v env/bin/python\n  torchrun: ~/v env/bin/torchrun\n"
                    "hosts: [localhost]\n")
    script = probe.render_probe(inventory_module.load(path), frozenset({"python", "torchrun"}))
    here = LocalConnection("localhost")
    found = probe.parse_facts(here.run(script, timeout=60).stdout, time.time())
    assert found.ok_text("python") == f"{tools}/python"
    assert found.ok_text("torchrun") == f"{tools}/torchrun"
    # As sshd does: a command starts in the home, not in the directory gpucluster runs in.
    assert here.run("pwd", timeout=10).stdout.strip() == str(home)


def test_a_node_lacking_tar_gzip_or_gnu_find_is_named_with_the_packages_to_install(
        tmp_path: Path) -> None:
    import shutil

    path = tmp_path / "inventory.yaml"
    path.write_text("hosts: [localhost]\n")
    loaded = inventory_module.load(path)
    script = probe.render_probe(loaded, frozenset({"tools", "path"}))

    def judged(env: dict[str, str] | None) -> list[CheckResult]:
        result = LocalConnection("localhost").run(script, timeout=60, env=env)
        found = probe.parse_facts(result.stdout, time.time())
        return REGISTRY["node-tools"].run(Context(loaded, {"localhost": found}, {}, {}))

    (here,) = judged(None)  # this machine has them all (scripts/system-packages)
    assert here.status is Status.OK and "gzip" in here.message
    # A minimal image's PATH: no gzip, setsid or awk, and busybox's find (no -printf).
    bare = tmp_path / "bin"
    bare.mkdir()
    for tool in Path("/usr/bin").iterdir():
        if tool.name not in ("gzip", "setsid", "awk", "find"):
            (bare / tool.name).symlink_to(tool)
    busybox = shutil.which("busybox")
    assert busybox is not None
    (bare / "find").symlink_to(busybox)
    (lacking,) = judged({"PATH": str(bare)})
    assert lacking.status is Status.FAIL
    assert lacking.message == ("lacks awk, gzip, setsid, find (not GNU's): launch's sync "
                               "and start run them here")
    assert lacking.remedy == ("install them: sudo apt install gawk gzip util-linux "
                              "findutils (RHEL: sudo dnf install gawk gzip util-linux "
                              "findutils)")
    assert lacking.details == {"PATH": str(bare)}


def test_torch_versions_are_cached_and_a_slow_first_import_is_stopped_and_named(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A stand-in for the job's python: it finds "torch" in a directory of its own, then
    # imports it in IMPORT_S seconds, or fails, as the file `mode` says.
    torch_dir = tmp_path / "site" / "torch"
    torch_dir.mkdir(parents=True)
    (torch_dir / "version.py").write_text("")
    mode = tmp_path / "mode"
    python = tmp_path / "python"
    python.write_text(f"""#!/bin/sh
case "$2" in *find_spec*) echo {torch_dir}; exit 0;; esac
case "$(cat {mode})" in
  slow) sleep 5;;
  fast) echo '{{"torch": "2.5.1", "cuda": "12.4", "nccl": "2.21.5"}}';;
  *) exit 3;;
esac
""")
    python.chmod(0o755)
    path = tmp_path / "inventory.yaml"
    path.write_text(f"cluster:\n  python: {python}\nhosts: [localhost]\n")
    loaded = inventory_module.load(path)
    monkeypatch.setattr(probe, "TORCH_IMPORT_TIMEOUT_S", 1)
    script = probe.render_probe(loaded, frozenset({"python", "torch"}))
    cache = tmp_path / "cache"

    def probed() -> probe.NodeFacts:
        result = LocalConnection("localhost").run(
            script, timeout=60, env={"XDG_CACHE_HOME": str(cache)})
        return probe.parse_facts(result.stdout, time.time())

    mode.write_text("slow")
    found = probed()
    assert found.torch is not None and found.torch.timed_out_s == 1
    (result,) = REGISTRY["torch"].run(Context(loaded, {"localhost": found}, {}, {}))
    assert result.status is Status.FAIL
    assert result.message == "importing torch took over 1 s and was stopped"
    assert "run doctor again" in result.remedy
    assert not cache.exists()  # nothing cached from an import that did not finish
    mode.write_text("fast")
    assert probed().torch == probe.TorchFacts("2.5.1", "12.4", "2.21.5", None)
    mode.write_text("broken")  # the next run reads the cache: no import at all
    assert probed().torch == probe.TorchFacts("2.5.1", "12.4", "2.21.5", None)


def test_container_toolkit_needed_with_an_image_except_on_simulated_gpus(tmp_path: Path
                                                                         ) -> None:
    podman = facts(runtimes="podman podman version 4.3.1")
    ctx = context(tmp_path, {"a": podman}, "").inventory
    path = tmp_path / "inventory.yaml"
    path.write_text("cluster:\n  image: localhost/x:1\ndefaults:\n  gpus: 1\nhosts: [a]\n")
    with_image = Context(inventory_module.load(path), {"a": podman}, {}, {})
    assert statuses("container-toolkit", with_image) == {"a": Status.FAIL}
    assert statuses("container-runtime", with_image) == {"a": Status.OK}
    path.write_text("cluster:\n  image: localhost/x:1\ndefaults:\n  gpus: 1\n"
                    "  torch_device: cpu\nhosts: [a]\n")
    sandbox = Context(inventory_module.load(path), {"a": podman}, {}, {})
    assert statuses("container-toolkit", sandbox) == {"a": Status.SKIP}
    assert ctx.cluster.image is None


def test_strict_turns_warnings_into_failure() -> None:
    from gpucluster.doctor.model import CheckResult
    from gpucluster.doctor.runner import DoctorReport

    warned = DoctorReport(("a",), ("shm",), (CheckResult("shm", "a", Status.WARN, "small"),))
    assert warned.worst(strict=False) is Status.WARN
    assert warned.worst(strict=True) is Status.FAIL
    clean = DoctorReport(("a",), ("shm",), (CheckResult("shm", "a", Status.OK, "fine"),
                                            CheckResult("xid", "a", Status.SKIP, "n/a")))
    assert clean.worst(strict=True) is Status.OK


def test_a_timed_out_probe_names_the_step_it_was_in() -> None:
    from gpucluster.doctor.probe import ProbeSteps

    steps = ProbeSteps()
    assert "before it printed anything" in steps.timeout_message(4)
    for line in ["@@gpc section clock", "1.0", "@@gpc end 0", "@@gpc section torch"]:
        steps.see("stdout", line)
    steps.see("stderr", "@@gpc end 0")  # only stdout frames the steps
    message = steps.timeout_message(4)
    assert message.startswith("the probe did not finish within --timeout 4s: its 'torch' "
                              "step had run ")
    assert "importing torch" in message and "cached" in message
    steps.see("stdout", "@@gpc end 0")
    assert steps.timeout_message(4).endswith("stalled after its 'torch' step")


def test_a_probe_for_checks_that_name_their_sections_gathers_only_those(
        tmp_path: Path) -> None:
    from gpucluster.doctor.model import probe_sections
    from gpucluster.launch.preflight import HOST_PREFLIGHT_CHECKS, PREFLIGHT_CHECKS

    path = tmp_path / "inventory.yaml"
    path.write_text("hosts:\n  - {name: a, address: 127.0.0.1, connection: local}\n")
    loaded = inventory_module.load(path)
    wanted = probe_sections([REGISTRY[name] for name in PREFLIGHT_CHECKS])
    assert wanted == {"jobs", "nvidia_smi_path", "gpus", "apps", "app_jobs", "port", "peers",
                      "addresses", "tools", "path"}
    host_checks = probe_sections([REGISTRY[name] for name in HOST_PREFLIGHT_CHECKS])
    assert host_checks == wanted | {"torchrun", "torch_build"}
    assert "import torch" not in probe.render_probe(loaded, host_checks)  # seconds a node
    assert probe_sections([REGISTRY["jobs"], REGISTRY["torch"]]) is None  # torch reads any
    for sections, expected in ((wanted, {"clock", "hostname", "jobs", "nvidia_smi_path"}),
                               (None, {"clock", "hostname", "jobs", "torch", "disk", "xid"})):
        output = LocalConnection("a").run(probe.render_probe(loaded, sections), timeout=60)
        found = set(reports.sections(output.stdout))
        assert expected <= found
        if sections is not None:  # nothing beyond what was asked (no nvidia-smi here)
            assert found <= sections | probe.ALWAYS_PROBED


def test_a_login_that_makes_commands_wait_is_a_warning_naming_the_login_scripts(
        tmp_path: Path) -> None:
    # pyenv's stale rehash lock: 60 s per login
    slow, quick = (dataclasses.replace(facts(), login_s=s) for s in (61.2, 0.3))
    results = {r.host: r for r in REGISTRY["ssh"].run(context(tmp_path, {"a": slow,
                                                                          "b": quick}))}
    assert results["a"].status is Status.WARN and results["b"].status is Status.OK
    assert "commands start 61.2 s later: a login script is slow" in results["a"].message
    assert "time `ssh root@a true`" in results["a"].remedy and ".bashrc" in results["a"].remedy


def test_a_login_failure_that_names_its_own_fix_gets_that_fix_alone(tmp_path: Path) -> None:
    from gpucluster.remote.result import FailureKind, HostFailure

    ctx = dataclasses.replace(context(tmp_path, {"a": facts()}), unreachable={
        "b": HostFailure("b", FailureKind.AUTH_FAILED, "identity file /k does not exist "
                                                       "(fix: set identity_file to your key)"),
        "c": HostFailure("c", FailureKind.AUTH_FAILED, "root@c:22 refused /k")})
    results = {r.host: r for r in REGISTRY["ssh"].run(ctx)}
    assert results["b"].message == "auth failed: identity file /k does not exist"
    assert results["b"].remedy == "set identity_file to your key"
    assert results["c"].message == "auth failed: root@c:22 refused /k"
    assert results["c"].remedy.startswith("check user and identity_file")


def test_the_probe_measures_the_login_from_sending_to_its_first_line() -> None:
    found = probe.parse_facts("@@gpc section clock\n1\n@@gpc end 0\n", 100.0, 103.5)
    assert found.login_s == 3.5
    assert probe.parse_facts("", 100.0).login_s is None  # no line seen: not measured


def test_the_cross_node_summary_leaves_out_what_was_not_probed(tmp_path: Path) -> None:
    """`doctor --only rendezvous-port` probes no GPU facts; its summary said "GPU: none
    on node[1-3]" of nodes with eight GPUs each."""
    from gpucluster.doctor.runner import cross_node_summary

    gathered = facts()
    unprobed = dataclasses.replace(gathered, sections={
        k: v for k, v in gathered.sections.items()
        if k not in ("nvidia_smi_path", "gpus", "nvidia_version", "torch")})
    assert cross_node_summary(context(tmp_path, {"n1": unprobed, "n2": unprobed})) == {}
    without = facts(gpus=[], nvidia_smi_path="")  # probed: no nvidia-smi there is news
    assert cross_node_summary(context(tmp_path, {"n1": without}))["GPU"] == {"none": ["n1"]}


def test_slurm_names_each_node_slurm_cannot_use_with_its_reason_and_fix(
        tmp_path: Path) -> None:
    listing = "a|idle|none\nb|drained|bad GPU 3\nc|down*|Not responding\n"
    ctx = context(tmp_path, {"a": facts(slurm=listing), "b": facts(slurm=listing),
                             "c": facts(slurm=listing), "d": facts(slurm="not set up")})
    results = {r.host: r for r in REGISTRY["slurm"].run(ctx)}
    assert {h: r.status for h, r in results.items()} == {
        "a": Status.OK, "b": Status.WARN, "c": Status.FAIL, "d": Status.SKIP}
    assert results["b"].message == "Slurm has it drained: bad GPU 3"
    assert "scontrol update nodename=b state=resume" in results["b"].remedy
    assert results["c"].message == ("Slurm has it down* (its slurmd is not responding): "
                                    "Not responding")
    assert results["c"].remedy.startswith("gpucluster provision --with slurm restarts")
    failed = "sinfo: error: Unable to contact slurm controller (connect failure)"
    down = {r.host: r for r in REGISTRY["slurm"].run(
        context(tmp_path, {"a": facts(slurm=failed)}))}
    assert (down["a"].status, down["a"].message) == (Status.WARN, f"sinfo failed: {failed}")


def test_a_refusal_while_a_job_holds_the_head_port_is_not_called_a_firewall(
        tmp_path: Path) -> None:
    """With the head's port held, peers probe whatever holds it: a refusal from it says
    nothing of a firewall (a job's store between its end and its exit, a listener on
    127.0.0.1), where a connect that times out is still a firewall dropping it."""
    from gpucluster.doctor.rendezvous import Reachability

    nodes = {name: facts() for name in ("a", "b", "c")}
    ctx = dataclasses.replace(
        context(tmp_path, nodes),
        network={"b": Reachability(port="refused"), "c": Reachability(port="timeout")},
        rendezvous_note="busy: port 29500 is held by gpucluster job 20261203-213149-b815")
    results = {r.host: r for r in REGISTRY["rendezvous-port"].run(ctx)}
    assert results["a"].status is Status.FAIL and "held by gpucluster job" in results["a"].message
    assert results["b"].status is Status.SKIP and "firewall" not in results["b"].remedy
    assert "see a's finding" in results["b"].message
    assert results["c"].status is Status.FAIL and "a firewall drops it" in results["c"].message
    smoke = dataclasses.replace(  # no record for stop to find: left to finish
        ctx, rendezvous_note="busy: port 29500 is held by gpucluster job "
                             "gpucluster-smoke-0123abcd")
    held = {r.host: r for r in REGISTRY["rendezvous-port"].run(smoke)}["a"]
    assert (held.message, held.remedy) == (
        "port 29500 is held by a smoke test (gpucluster-smoke-0123abcd) on the head node",
        "let it finish: it ends within its --timeout (300 s unless given)")
    free = dataclasses.replace(ctx, rendezvous_note=None)  # nothing held: a refusal is one
    assert {r.host: r.status for r in REGISTRY["rendezvous-port"].run(free)}["b"] is \
        Status.FAIL


@pytest.mark.parametrize("names", [("a", "b", "c"), ("a", "b")])
def test_a_cluster_where_no_node_knows_the_others_gets_one_finding(
        tmp_path: Path, names: tuple[str, ...]) -> None:
    """A fresh cluster: each node resolves only itself (or itself to 127.0.1.1). Each node
    had its own finding ("b, c do not resolve" on a, "a, c" on b...), each fix a list of
    every other node: on 16 nodes, 16 findings of 15 lines each. Now one, for all."""
    from gpucluster.doctor.rendezvous import Reachability

    path = tmp_path / "inventory.yaml"
    path.write_text("hosts:\n" + "".join(
        f"  - {{name: {n}, address: 10.0.0.{i}}}\n" for i, n in enumerate(names, 1)))
    address = {n: f"10.0.0.{i}" for i, n in enumerate(names, 1)}

    def failures(resolved: dict[str, dict[str, str | None]]) -> dict[str, tuple[str, str]]:
        ctx = Context(inventory_module.load(path), {n: facts(hostname=n) for n in names}, {},
                      {n: Reachability(resolved[n]) for n in names})
        return {r.host: (r.message, r.remedy) for r in REGISTRY["name-resolution"].run(ctx)
                if r.status is Status.FAIL}

    every_line = "; ".join(f"{address[n]} {n}" for n in names)
    others = "no other node's hostname resolves" if len(names) > 2 else \
        "the other node's hostname does not resolve"
    for own, said in (("cluster", others),
                      ("127.0.1.1", f"{others}; its own hostname resolves to 127.0.1.1 "
                                    f"(loopback)")):
        resolved = {n: {m: (address[n] if own == "cluster" else own) if m == n else None
                        for m in names} for n in names}
        found = failures(resolved)
        assert set(found) == set(names)
        [(message, remedy)] = set(found.values())
        assert message == said
        assert f"on the node: {every_line} (and remove" in remedy
    if len(names) == 2:
        return
    # one name that every other node misses is still named, with its line alone
    resolved = {n: {m: address[m] if m == n or m != names[0] else None for m in names}
                for n in names}
    found = failures(resolved)
    assert set(found) == set(names[1:])
    for message, remedy in found.values():
        assert message == f"{names[0]} does not resolve"
        assert f"on the node: {address[names[0]]} {names[0]} (and remove" in remedy


def test_a_fix_past_eight_hosts_names_the_command_that_prints_them() -> None:
    from gpucluster.doctor.checks.network import _resolution_remedy

    assert "10.0.0.8 n8 (and" in _resolution_remedy([f"10.0.0.{i} n{i}" for i in range(1, 9)])
    many = _resolution_remedy([f"10.0.0.{i} n{i}" for i in range(1, 10)])
    assert "10.0.0.1" not in many and "`gpucluster provision --only hosts --dry-run`" in many


def test_nodes_blocked_from_the_head_port_share_one_finding_and_one_rule(
        tmp_path: Path) -> None:
    """Each blocked node's fix named its own address (`-s b`, `-s c`...), so a fresh
    cluster behind a default-drop firewall got a finding per node; one rule with every
    blocked address makes them one finding, and opens the port to all of them."""
    from gpucluster.doctor.rendezvous import Reachability

    nodes = {name: facts() for name in ("a", "b", "c", "d")}
    ctx = dataclasses.replace(context(tmp_path, nodes), network={
        "b": Reachability(port="timeout"), "c": Reachability(port="timeout"),
        "d": Reachability(port="open")})
    results = {r.host: r for r in REGISTRY["rendezvous-port"].run(ctx)}
    assert {h: r.status for h, r in results.items()} == {
        "a": Status.OK, "b": Status.FAIL, "c": Status.FAIL, "d": Status.OK}
    assert (results["b"].message, results["b"].remedy) == \
        (results["c"].message, results["c"].remedy)
    assert "on a: sudo iptables -I INPUT -p tcp --dport 29500 -s b,c -j ACCEPT" in \
        results["b"].remedy


def test_nodes_named_alike_share_one_finding_in_inventory_order(tmp_path: Path) -> None:
    """Clones all named `ubuntu`: each node's message listed the others and its fix named
    the node, a finding per node. Now one message for the group and one fix, with an
    example; the results stay in inventory order."""
    hostnames = {"a": "ubuntu", "b": "localhost", "c": "ubuntu", "d": "d", "e": "ubuntu"}
    ctx = context(tmp_path, {node: facts(hostname=name) for node, name in hostnames.items()})
    results = REGISTRY["hostname"].run(ctx)
    assert [r.host for r in results] == list(hostnames)
    by_host = {r.host: r for r in results}
    assert {(by_host[h].message, by_host[h].remedy) for h in "ace"} == {(
        "hostname 'ubuntu' is shared by a,c,e", "torchrun and NCCL identify nodes by "
        "hostname: give each node its own (its inventory name: on a, sudo hostnamectl "
        "set-hostname a)")}
    assert by_host["b"].message == "hostname is 'localhost'"
    assert "on b, sudo hostnamectl set-hostname b" in by_host["b"].remedy
    assert by_host["d"].status is Status.OK


def mesh_section(port: int = 45000, listen: str = "ok", **peers: str) -> str:
    return "\n".join([f"port {port}", "range 32768 60999", f"listen {listen}",
                      *(f"peer {address} {state}" for address, state in peers.items())])


def test_peer_ports_judge_each_node_by_what_the_others_saw_of_it(tmp_path: Path) -> None:
    """The port mesh: every node listened on one port of the ephemeral range and
    connected to every other's. A node only some reach names them; a node none reach, or
    a cluster behind a default-drop firewall, gets a rule for every address, so that the
    findings fold into one."""
    def run(meshes: dict[str, str]) -> dict[str, tuple[Status, str, str]]:
        ctx = context(tmp_path, {n: facts(peers=text) for n, text in meshes.items()})
        return {r.host: (r.status, r.message, r.remedy)
                for r in REGISTRY["peer-ports"].run(ctx)}

    healthy = run({"a": mesh_section(b="open", c="open"), "b": mesh_section(a="open", c="open"),
                   "c": mesh_section(a="open", b="open")})
    assert {s for s, _, _ in healthy.values()} == {Status.OK}
    assert healthy["a"][1] == "port 45000 (of 32768-60999) reached from 2 other nodes"

    c_dropped = run({"a": mesh_section(b="open", c="timeout"),
                     "b": mesh_section(a="open", c="timeout"),
                     "c": mesh_section(a="open", b="open")})
    assert (c_dropped["a"][0], c_dropped["b"][0]) == (Status.OK, Status.OK)
    status, message, remedy = c_dropped["c"]
    assert status is Status.FAIL
    assert message == ("port 45000, of the range NCCL and gloo connect on (32768-60999), is "
                       "not reachable from any other node: no answer (a firewall drops it)")
    assert "by hand, on the node: sudo iptables -I INPUT -p tcp --dport 32768:60999 -s a,b,c " \
           "-j ACCEPT" in remedy
    assert remedy.startswith("gpucluster provision --only firewall")

    only_from_a = run({"a": mesh_section(b="open", c="refused"),
                       "b": mesh_section(a="open", c="open"),
                       "c": mesh_section(a="open", b="open")})
    assert only_from_a["c"][1].endswith("is not reachable from a: refused (a firewall rejects it)")
    assert "-s a -j ACCEPT" in only_from_a["c"][2]

    default_drop = run({n: mesh_section(**{p: "timeout" for p in "abc" if p != n}) for n in "abc"})
    assert {s for s, _, _ in default_drop.values()} == {Status.FAIL}
    assert len({(m, r) for _, m, r in default_drop.values()}) == 1  # one finding for all

    # Its listener could not start: that node is not judged, the others still are.
    busy = run({"a": mesh_section(b="refused", c="open"), "b": mesh_section(listen="busy", a="open",
                                                                           c="open"),
                "c": mesh_section(a="open", b="refused")})
    assert busy["b"][0] is Status.SKIP and "run doctor again" in busy["b"][1]
    assert (busy["a"][0], busy["c"][0]) == (Status.OK, Status.OK)
    # No python to run it: the section holds what the shell said.
    missing = run({"a": "sh: 1: python3: not found", "b": mesh_section(a="open"),
                   "c": mesh_section(a="open")})
    assert missing["a"][0] is Status.SKIP
    assert missing["a"][1] == ("not tested: the port mesh did not start here (error sh: 1: "
                               "python3: not found)")


def test_path_mtu_names_the_pairs_whose_full_size_packets_are_lost(tmp_path: Path) -> None:
    """Two nodes with jumbo frames behind a switch that carries 1500: each connected to
    the other (peer-ports passes), but neither's full-size segment arrived."""
    a, b, c = "10.0.0.1", "10.0.0.2", "10.0.0.3"
    mtus = {a: 1500, b: 9000, c: 9000}

    def node(me: str, **peers: str) -> probe.NodeFacts:
        return facts(peers=mesh_section(**peers), addresses=f"lo 127.0.0.1/8 65536\n"
                                                            f"eth0 {me}/24 {mtus[me]}")

    def run(nodes: dict[str, probe.NodeFacts]) -> dict[str, tuple[Status, str, str]]:
        ctx = context(tmp_path, nodes)
        assert {r.status for r in REGISTRY["peer-ports"].run(ctx)} == {Status.OK}
        return {r.host: (r.status, r.message, r.remedy) for r in REGISTRY["path-mtu"].run(ctx)}

    jumbo = run({a: node(a, **{b: "open", c: "open"}),
                 b: node(b, **{a: "open", c: "stalled 8948"}),
                 c: node(c, **{a: "open", b: "stalled 8948"})})
    assert jumbo[a][:2] == (Status.OK, "full-size packets (MTU 1500) arrive from 2 other nodes")
    status, message, remedy = jumbo[b]
    assert status is Status.FAIL
    assert message.startswith(f"full-size packets (MTU 9000) from {c} do not arrive, though "
                              f"small ones do: something between them")
    assert "ping -M do -s 8972 -c 3 ADDRESS" in remedy
    assert jumbo[c][1].startswith(f"full-size packets (MTU 9000) from {b} do not arrive")

    # Every node jumbo, the switch not: one finding for all of them.
    mtus[a] = 9000
    everyone = run({me: node(me, **{p: "stalled 8948" for p in (a, b, c) if p != me})
                    for me in (a, b, c)})
    assert {s for s, _, _ in everyone.values()} == {Status.FAIL}
    assert len({(m, r) for _, m, r in everyone.values()}) == 1
    assert "from every other node do not arrive" in everyone[a][1]

    # A node nobody connected to is peer-ports' finding, not this one's.
    ctx = context(tmp_path, {a: node(a, **{b: "open"}), b: node(b, **{a: "timeout"})})
    assert statuses("path-mtu", ctx)[a] is Status.SKIP


def test_the_real_port_mesh_runs_here(tmp_path: Path) -> None:
    """The probe's own script on this machine, its listener reached on the loopback."""
    path = tmp_path / "inventory.yaml"
    path.write_text("hosts: [localhost]\n")
    script = probe.render_probe(inventory_module.load(path), frozenset({"peers"}))
    here = LocalConnection("localhost")
    result = here.run("export GPC_MESH='45123 3 127.0.0.1'; " + script, timeout=60)
    mesh = probe.parse_facts(result.stdout, time.time()).mesh
    assert mesh is not None
    assert (mesh.port, mesh.listen, mesh.peers) == (45123, "ok", {"127.0.0.1": "open"})
    assert mesh.range and ":" in mesh.range


def test_the_mesh_answers_its_peers_and_no_stranger() -> None:
    """A connection that does not say a segment size first, or says one no segment has
    (anything but a peer's), is closed unanswered, and the peers are still answered."""
    import contextlib
    import socket
    import subprocess
    import sys

    from gpucluster.templating import script_text

    with socket.socket() as probe_port:
        probe_port.bind(("127.0.0.1", 0))
        port = probe_port.getsockname()[1]
    # Two peers named: this machine, and one that never connects (TEST-NET-1, routed
    # nowhere), so that the listener stays up, waiting for it, while the strangers come:
    # with two peers that are this machine it could end before they did.
    mesh = subprocess.Popen([sys.executable, "-c", script_text("doctor/port_mesh.py"),
                             f"{port} 1 127.0.0.1 192.0.2.1"],
                            stdout=subprocess.PIPE, text=True)
    strangers = []
    deadline = time.monotonic() + 5
    while len(strangers) < 2 and time.monotonic() < deadline:
        try:
            strangers.append(socket.create_connection(("127.0.0.1", port), timeout=1))
        except ConnectionRefusedError:
            time.sleep(0.01)
    junk, too_large = strangers
    for stranger, words in ((junk, b"x" * 4096), (too_large, b"99999999\n" + bytes(1000))):
        with contextlib.suppress(OSError):
            stranger.sendall(words)
    out, _ = mesh.communicate(timeout=30)
    assert "peer 127.0.0.1 open" in out.splitlines(), out
    for stranger in strangers:
        stranger.settimeout(2)
        with contextlib.suppress(ConnectionResetError):
            assert stranger.recv(64) == b""  # closed, unanswered
        stranger.close()
