"""The sandbox's simulated nvidia-smi replays every real capture faithfully."""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from pathlib import Path

import pytest

from gpucluster.sandbox import captures, fake_nvidia_smi

CAPTURE_FILES = sorted(captures.CAPTURE_DIR.glob("*__*__*.txt"))
SLUGS = [captures._slug(p)[0] for p in CAPTURE_FILES]


def _state(tmp_path: Path, **state: object) -> Path:
    path = tmp_path / "gpu.json"
    path.write_text(json.dumps({"count": 2, "driver": None, "fault": None, **state}))
    return path


def _run(state: Path, *args: str, capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = fake_nvidia_smi.main(["--state", str(state), *args])
    out, err = capsys.readouterr()
    return code, out, err


def test_every_capture_is_shipped_with_its_licence() -> None:
    assert len(CAPTURE_FILES) == 6
    assert (captures.CAPTURE_DIR / "LICENSE-nvidia_gpu_exporter").is_file()


@pytest.mark.parametrize("slug", SLUGS)
def test_replay_matches_the_raw_capture(slug: str, tmp_path: Path,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    raw = next(p for p in CAPTURE_FILES if captures._slug(p)[0] == slug).read_text()
    product = re.search(r"Product Name\s*:\s*(.+)", raw).group(1).strip()
    driver = re.search(r"DRIVER version\s*:\s*(\S+)", raw).group(1)
    state = _state(tmp_path, model=slug)

    code, out, _ = _run(state, "--query-gpu=index,name,driver_version,memory.total",
                        "--format=csv,noheader", capsys=capsys)
    assert code == 0
    rows = [row.split(", ") for row in out.strip().splitlines()]
    assert [r[0] for r in rows] == ["0", "1"]
    assert {r[1] for r in rows} == {product}
    assert {r[2] for r in rows} == {driver}
    assert rows[0][3].endswith(" MiB")

    code, out, _ = _run(state, "-q", capsys=capsys)
    assert out.count(f"Product Name                                       : {product}") == 2
    assert re.search(r"Attached GPUs\s*:\s*2", out)

    code, out, _ = _run(state, "-L", capsys=capsys)
    assert out.count(product) == 2


def test_list_shows_a_mig_gpus_devices_under_each_gpu_as_the_capture_does(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _, out, _ = _run(_state(tmp_path, model="h100-mig", node="node1"), "-L", capsys=capsys)
    lines = out.splitlines()
    assert len(lines) == 2 * 5  # each GPU, then the captured GPU's four MIG devices
    assert lines[0].startswith("GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-")
    assert lines[1].startswith("  MIG 3g.40gb     Device  0: (UUID: MIG-")
    assert lines[5].startswith("GPU 1: ")
    assert re.match(r"  MIG 1g\.10gb     Device  3: \(UUID: MIG-[0-9a-f-]+\)$", lines[9])
    uuids = re.findall(r"UUID: (\S+)\)", out)
    assert len(set(uuids)) == 10  # every GPU and MIG device its own, as on a real node
    _, whole, _ = _run(_state(tmp_path, model="h100", node="node1"), "-L", capsys=capsys)
    assert "MIG" not in whole and len(whole.splitlines()) == 2


def test_nounits_and_header_forms(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    state = _state(tmp_path, model="h100", count=1)
    _, out, _ = _run(state, "--query-gpu", "memory.total,persistence_mode,mig.mode.current",
                     "--format=csv", capsys=capsys)
    assert out == "memory.total [MiB], persistence_mode, mig.mode.current\n" \
                  "81559 MiB, Enabled, Disabled\n"
    # nounits takes the units off the values only, as a real H200 showed (tests/fixtures)
    _, out, _ = _run(state, "--query-gpu=memory.total", "--format=csv,nounits", capsys=capsys)
    assert out == "memory.total [MiB]\n81559\n"


def test_staged_driver_changes_every_form(tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    state = _state(tmp_path, model="h200", driver="535.104.05")
    _, out, _ = _run(state, "--version", capsys=capsys)
    assert "DRIVER version      : 535.104.05" in out
    assert "CUDA Version        : 12.2" in out
    _, out, _ = _run(state, "-q", capsys=capsys)
    assert "590.48" not in out and "CUDA Version                                           : 12.2" \
        in out


def test_hung_driver_never_answers(tmp_path: Path) -> None:
    import subprocess
    import sys

    state = _state(tmp_path, model="h100", fault="hung")
    with pytest.raises(subprocess.TimeoutExpired):
        subprocess.run([sys.executable, "-m", "gpucluster.sandbox.fake_nvidia_smi", "--state",
                        str(state), "-L"], capture_output=True, timeout=2, check=False)


def test_failed_driver_and_no_devices(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _run(_state(tmp_path, model="h100", fault="failed"), "-L", capsys=capsys)
    assert code == fake_nvidia_smi.EXIT_DRIVER_FAILURE
    assert out.startswith("NVIDIA-SMI has failed because it couldn't communicate")


def test_compute_apps_lists_live_registered_processes(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    state = _state(tmp_path, model="h100", count=4)
    exited = subprocess.Popen(["true"])  # a zombie until waited: its GPU memory is freed
    while Path(f"/proc/{exited.pid}/stat").read_text().rpartition(")")[2].split()[0] != "Z":
        time.sleep(0.01)
    state.with_suffix(".apps").write_text(f"{os.getpid()} 3 2048 python train.py\n"
                                          "999999999 0 10 gone\n"
                                          f"{exited.pid} 1 512 python exited.py\n")
    _, out, _ = _run(state, "--query-compute-apps=pid,process_name,used_memory,gpu_bus_id",
                     "--format=csv,noheader,nounits", capsys=capsys)
    exited.wait()
    assert out == f"{os.getpid()}, python train.py, 2048, 00000000:1B:00.0\n"


@pytest.mark.parametrize("args", [["--bogus"], ["--query-gpu=nope", "--format=csv"],
                                  ["-i", "9", "-L"], ["--query-gpu=name", "--format=xml"]])
def test_unsupported_forms_exit_2_saying_simulated(
        args: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = _run(_state(tmp_path, model="h100"), *args, capsys=capsys)
    assert code == 2
    assert "simulated by gpucluster sandbox" in err


def test_cuda_for_driver_table() -> None:
    assert fake_nvidia_smi.cuda_for_driver("550.54.15", "x") == "12.4"
    assert fake_nvidia_smi.cuda_for_driver("999.1", "13.1") == "13.1"


def test_a_worker_with_local_rank_is_a_busy_compute_process_on_its_gpu(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import subprocess
    import sys

    state = _state(tmp_path, model="h200")
    spin = subprocess.Popen([sys.executable, "-c", "while True: pass"],
                            env={**os.environ, "LOCAL_RANK": "1"})
    idle = subprocess.Popen([sys.executable, "-c", "import time; print(flush=True); "
                             "time.sleep(60)"], env={**os.environ, "LOCAL_RANK": "0"},
                            stdout=subprocess.PIPE)
    try:
        assert idle.stdout is not None
        idle.stdout.readline()  # started: asleep from now on
        code, out, _ = _run(state, "--query-compute-apps=pid,gpu_uuid,used_memory",
                            "--format=csv,noheader,nounits", capsys=capsys)
        assert code == 0
        apps = {int(pid): (uuid, int(mib)) for pid, uuid, mib in
                (line.split(", ") for line in out.strip().splitlines())}
        assert apps[spin.pid][0].endswith("0001") and apps[idle.pid][0].endswith("0000")
        assert apps[spin.pid][1] > 0  # its resident memory
        _, out, _ = _run(state, "--query-gpu=index,utilization.gpu,memory.used",
                            "--format=csv,noheader,nounits", capsys=capsys)
        busy = {int(i): (int(u), int(m)) for i, u, m in
                (line.split(", ") for line in out.strip().splitlines())}
        # Follows the CPU use (how much the spinner gets depends on the machine's load).
        assert busy[1][0] >= 5 and busy[0][0] == 0, busy
        assert busy[1][1] >= apps[spin.pid][1]
        # A working GPU boosts its SM clock to the maximum, as the loaded captures show.
        _, out, _ = _run(state, "--query-gpu=index,clocks.sm,clocks.mem,temperature.memory",
                         "--format=csv,nounits", capsys=capsys)
        header, *rows = out.strip().splitlines()
        assert header == ("index, clocks.current.sm [MHz], clocks.current.memory [MHz], "
                          "temperature.memory")
        clocks = {int(i): (int(sm), int(mem), int(t)) for i, sm, mem, t in
                  (line.split(", ") for line in rows)}
        assert clocks[0] == (345, 3201, 32) and clocks[1][:2] == (1980, 3201), clocks
        # Idle is a clock event (as the idle capture has it); working is none.
        _, out, _ = _run(state, "--query-gpu=clocks_throttle_reasons.active",
                         "--format=csv,noheader", capsys=capsys)
        assert out.split() == ["0x0000000000000001", "0x0000000000000000"]
        # A staged thermal slowdown: on both GPUs, and the working one's clock halved.
        slowed = _state(tmp_path, model="h200", slowdown="hw_thermal")
        _, out, _ = _run(slowed, "--query-gpu=clocks_event_reasons.active,clocks.sm,"
                         "clocks_event_reasons.hw_thermal_slowdown",
                         "--format=csv,noheader,nounits", capsys=capsys)
        assert out.splitlines() == ["0x0000000000000041, 345, Active",
                                    "0x0000000000000040, 990, Active"], out
    finally:
        spin.kill()
        idle.kill()


def test_a_worker_with_cuda_visible_devices_is_on_the_gpu_it_lists(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """launch --gpus 2-3: CUDA numbers the GPUs it lists from 0, so local rank 0 is on
    GPU 2, as nvidia-smi shows a real one; a rank past the list is on no GPU."""
    import subprocess
    import sys

    state = _state(tmp_path, model="h200", count=4)
    ranks = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"],
                              env={**os.environ, "LOCAL_RANK": str(rank),
                                   "CUDA_VISIBLE_DEVICES": "2,3"}) for rank in (0, 1, 2)]
    try:
        _, out, _ = _run(state, "--query-compute-apps=pid,gpu_uuid",
                         "--format=csv,noheader", capsys=capsys)
        apps = dict(line.split(", ") for line in out.strip().splitlines())
        assert apps[str(ranks[0].pid)].endswith("0002")
        assert apps[str(ranks[1].pid)].endswith("0003")
        assert str(ranks[2].pid) not in apps
    finally:
        for rank in ranks:
            rank.kill()


def test_the_streaming_loop_prints_rows_every_period(tmp_path: Path) -> None:
    import subprocess
    import sys
    import time

    state = _state(tmp_path, model="h200")
    loop = subprocess.Popen([sys.executable, "-m", "gpucluster.sandbox.fake_nvidia_smi",
                             "--state", str(state), "--query-gpu=index,utilization.gpu",
                             "--format=csv", "-lms", "200"], stdout=subprocess.PIPE,
                            text=True)
    assert loop.stdout is not None
    started = time.monotonic()
    lines = [loop.stdout.readline() for _ in range(7)]
    loop.kill()
    assert lines[0].startswith("index, utilization.gpu")  # the header once
    assert [line.split(",")[0] for line in lines[1:]] == ["0", "1"] * 3
    assert time.monotonic() - started >= 0.4  # three rounds, 200 ms apart


def test_each_nodes_gpus_have_uuids_of_their_own(tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    """Real GPUs' UUIDs are unique across a cluster: every sandbox node's were the same
    (GPU-00000000-...-000000000000), which would hide a table keyed by UUID alone."""
    seen = {}
    for node in ("node1", "node2", "node1"):
        (tmp_path / node).mkdir(exist_ok=True)
        state = _state(tmp_path / node, model=SLUGS[0], node=node)
        code, out, _ = _run(state, "--query-gpu=uuid", "--format=csv,noheader", capsys=capsys)
        assert code == 0
        uuids = out.split()
        assert len(set(uuids)) == 2 and all(
            re.fullmatch(r"GPU-[0-9a-f]{8}(-[0-9a-f]{4}){3}-[0-9a-f]{12}", u) for u in uuids)
        assert seen.setdefault(node, uuids) == uuids  # stable from one call to the next
        _, full, _ = _run(state, "-q", capsys=capsys)  # the same in every form
        assert re.findall(r"GPU UUID\s*:\s*(\S+)", full) == uuids
    assert not set(seen["node1"]) & set(seen["node2"])
