"""A simulated `nvidia-smi` for sandbox nodes: replays a real capture, scaled to the
node's staged GPU count and driver version.

It answers the forms the project uses: `--version`, `-L`, `-q`, `topo -m`, the default
table, `--query-gpu=...` and `--query-compute-apps=...` with `--format=csv[,noheader]
[,nounits]`, `-i` to pick GPUs, and the streaming loops `-l SEC`/`-lms MS` (the header
once, then the rows every period until killed). Anything else exits 2 saying it is
simulated. The GPUs' processes, memory, utilisation, temperatures, power and clocks
follow the node's torchrun workers (gpu_load, gpu_values).
The node's state file (JSON) is written by `gpucluster sandbox up`:

    {"model": "h100", "count": 8, "driver": "535.104.05", "fault": null, "slowdown": null,
     "node": "node1"}

`fault` stages a broken driver: "failed" (nvidia-smi cannot reach it, exit 9) or "hung"
(nvidia-smi never answers, as on a wedged GPU); `slowdown` a clock event reason
(gpucluster.clock_events) on every GPU.

Processes "holding" a simulated GPU are listed one per line in `<state>.apps` as
`pid gpu_index used_mib name`; only those still alive are reported.
"""

from __future__ import annotations

import json
import os
import re
import sys
import time
import zlib
from dataclasses import dataclass
from pathlib import Path

from gpucluster.sandbox.captures import Capture, load
from gpucluster.sandbox.gpu_load import GpuProcess, Load, planted, workers
from gpucluster.sandbox.gpu_values import clock_events_of, loaded, strip_unit

DRIVER_FAILURE = (
    "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
    "Make sure that the latest NVIDIA driver is installed and running.\n"
)
EXIT_DRIVER_FAILURE = 9  # what real nvidia-smi returns in that case

# The CUDA version each driver branch supports (NVIDIA's CUDA/driver compatibility table).
CUDA_BY_DRIVER_BRANCH = {
    470: "11.4", 510: "11.6", 515: "11.7", 520: "11.8", 525: "12.0", 530: "12.1",
    535: "12.2", 545: "12.3", 550: "12.4", 555: "12.5", 560: "12.6", 565: "12.7",
    570: "12.8", 575: "12.9", 580: "13.0", 590: "13.1", 595: "13.2",
}
_FIELD_ALIASES = {"gpu_name": "name", "gpu_uuid": "uuid", "gpu_bus_id": "pci.bus_id",
                  "gpu_serial": "serial", "clocks.sm": "clocks.current.sm",
                  "clocks.mem": "clocks.current.memory"}
# Driver 535 renamed clocks_throttle_reasons.* to clocks_event_reasons.*; both are taken.
_THROTTLE_RENAMED = ("clocks_throttle_reasons.", "clocks_event_reasons.")
_APP_FIELDS = ("timestamp", "gpu_name", "gpu_bus_id", "gpu_serial", "gpu_uuid", "pid",
               "process_name", "used_gpu_memory")


@dataclass(frozen=True)
class SimulatedNode:
    """What this node's GPUs look like: a capture, scaled and re-versioned."""

    capture: Capture
    count: int
    driver: str
    cuda: str
    apps_file: Path
    slowdown: str | None = None  # a clock event reason staged on every GPU (--clock-slowdown)
    node: str = ""  # the sandbox node's name: its GPUs' UUIDs are its own, as real ones are

    def bus_id(self, index: int) -> str:
        return f"00000000:{index + 0x18:02X}:00.0"

    def uuid(self, index: int) -> str:
        return f"GPU-{zlib.crc32(self.node.encode()):08x}-0000-0000-0000-{index:012d}"

    def mig_uuid(self, index: int, device: int) -> str:
        return f"MIG-{zlib.crc32(self.node.encode()):08x}-{index:04d}-0000-0000-{device:012d}"

    def retext(self, text: str) -> str:
        """A capture's text with this node's driver and CUDA version in it."""
        text = text.replace(self.capture.driver, self.driver)
        nvml = ".".join(self.driver.split(".")[:2])
        text = re.sub(r"(NVML version\s*:\s*)[\d.]+", rf"\g<1>{nvml}", text)
        return re.sub(r"(CUDA Version\s*:\s*)[\d.]+", rf"\g<1>{self.cuda}", text)


def cuda_for_driver(driver: str, fallback: str) -> str:
    try:
        branch = int(driver.split(".", maxsplit=1)[0])
    except ValueError:
        return fallback
    return CUDA_BY_DRIVER_BRANCH.get(branch, fallback)


def _capture_cuda(capture: Capture) -> str:
    match = re.search(r"CUDA Version\s*:\s*([\d.]+)", capture.section("capabilities", "version"))
    return match.group(1) if match else "12.0"


def load_node(state_path: Path) -> SimulatedNode | None:
    """The node's simulation, or None when its driver is staged as failed."""
    state = json.loads(state_path.read_text())
    if state.get("fault") == "hung":
        time.sleep(24 * 3600)
    if state.get("fault") == "failed":
        return None
    capture = load(state["model"])
    driver = state.get("driver") or capture.driver
    cuda = state.get("cuda") or cuda_for_driver(driver, _capture_cuda(capture))
    return SimulatedNode(capture, int(state["count"]), driver, cuda,
                         state_path.with_suffix(".apps"), state.get("slowdown"),
                         state.get("node", ""))


class UsageError(Exception):
    """Arguments the simulation does not answer; message goes to stderr, exit 2."""


def _csv(header: list[str], rows: list[list[str]], options: set[str]) -> str:
    if "csv" not in options:
        raise UsageError("--format=csv is the only format the simulation answers")
    if "nounits" in options:  # the values lose their units; the header keeps them
        rows = [[strip_unit(v) for v in row] for row in rows]
    lines = [] if "noheader" in options else [", ".join(header)]
    lines.extend(", ".join(row) for row in rows)
    return "\n".join(lines) + "\n"


def _timestamp() -> str:
    now = time.time()
    milliseconds = int(now * 1000) % 1000
    return time.strftime("%Y/%m/%d %H:%M:%S", time.localtime(now)) + f".{milliseconds:03d}"


def query_gpu(node: SimulatedNode, fields: list[str], indices: list[int],
              options: set[str], load: Load | None = None) -> str:
    values = node.capture.query_gpu_fields()
    apps = live_apps(node)
    busy = (load or Load()).utilisation(apps, node.count)
    headers = node.capture.query_gpu_units()
    header: list[str] = []
    canonical: list[str] = []
    for field in fields:
        name = _FIELD_ALIASES.get(field, field).replace(*_THROTTLE_RENAMED)
        if name not in values:
            raise UsageError(f'Field "{field}" is not a valid field to query.')
        canonical.append(name)
        header.append(headers[name])
    rows = []
    for index in indices:
        per_gpu = {**values, **loaded(values, index, apps, busy),
                   **clock_events_of(values, busy[index], node.slowdown),
                   "index": str(index), "count": str(node.count),
                   "pci.bus_id": node.bus_id(index), "uuid": node.uuid(index),
                   "driver_version": node.driver, "timestamp": _timestamp()}
        rows.append([per_gpu[name] for name in canonical])
    return _csv(header, rows, options)


def live_apps(node: SimulatedNode) -> list[GpuProcess]:
    """The node's workers and the registered processes, those still running."""
    return planted(node.apps_file, node.count) + workers(node.count)


def query_apps(node: SimulatedNode, fields: list[str], options: set[str]) -> str:
    name = node.capture.query_gpu_fields()["name"]
    canonical = ["used_gpu_memory" if f == "used_memory" else f for f in fields]
    for field, known in zip(fields, canonical, strict=True):
        if known not in _APP_FIELDS:
            raise UsageError(f'Field "{field}" is not a valid field to query.')
    header = ["used_gpu_memory [MiB]" if f == "used_gpu_memory" else f for f in canonical]
    rows = []
    for app in live_apps(node):
        record = {"timestamp": _timestamp(), "gpu_name": name,
                  "gpu_bus_id": node.bus_id(app.gpu), "gpu_serial": "0000000000000",
                  "gpu_uuid": node.uuid(app.gpu), "pid": str(app.pid),
                  "process_name": app.name, "used_gpu_memory": f"{app.used_mib} MiB"}
        rows.append([record[f] for f in canonical])
    return _csv(header, rows, options)


def full_query(node: SimulatedNode, indices: list[int]) -> str:
    """`-q`: the capture's report with its one GPU block repeated per GPU."""
    text = node.retext(node.capture.section("idle", "query (-q)"))
    head, _, block = text.partition("\nGPU ")
    original_bus = block.split("\n", 1)[0].strip()
    head = re.sub(r"(Attached GPUs\s*:\s*)\d+", rf"\g<1>{node.count}", head)
    blocks = ["GPU " + re.sub(r"(GPU UUID\s*:\s*)\S+", rf"\g<1>{node.uuid(i)}",
                              block.replace(original_bus, node.bus_id(i))).rstrip("\n")
              for i in indices]
    return head + "\n" + "\n\n".join(blocks) + "\n"


_MIG_DEVICE = re.compile(r"^(\s+MIG .*Device\s+(\d+): \(UUID: )\S+\)$", re.MULTILINE)


def gpu_list(node: SimulatedNode, indices: list[int]) -> str:
    """`-L`: a line per GPU and, on a MIG capture, its MIG devices under it (as the
    captured GPU has them), each with a UUID of its own."""
    name = node.capture.query_gpu_fields()["name"]
    devices = _MIG_DEVICE.findall(node.capture.section("capabilities", "list (-L)"))
    return "".join(f"GPU {i}: {name} (UUID: {node.uuid(i)})\n"
                   + "".join(f"{line}{node.mig_uuid(i, int(device))})\n"
                             for line, device in devices)
                   for i in indices)


def _option_value(args: list[str], index: int) -> tuple[str, int]:
    arg = args[index]
    if "=" in arg:
        return arg.split("=", 1)[1], index + 1
    if index + 1 >= len(args):
        raise UsageError(f"{arg} needs a value")
    return args[index + 1], index + 2


def loop_period(args: list[str]) -> tuple[float | None, list[str]]:
    """`-l SEC`/`--loop=SEC`/`-lms MS`/`--loop-ms=MS`: the period in seconds, and the
    arguments without it."""
    for index, arg in enumerate(args):
        name = arg.split("=", 1)[0]
        if name in ("-l", "--loop", "-lms", "--loop-ms"):
            value, after = _option_value(args, index)
            if not value.isdigit() or int(value) == 0:
                raise UsageError(f"{name} needs a positive whole number")
            seconds = int(value) / (1000 if name in ("-lms", "--loop-ms") else 1)
            return seconds, args[:index] + args[after:]
    return None, args


def stream(node: SimulatedNode, args: list[str], period: float) -> None:
    """Print the answer every `period` seconds (the header only the first time), as
    nvidia-smi's loop does, until killed or its reader goes away."""
    load = Load()
    first = True
    while True:
        text = answer(node, args, load)
        if not first and args and any(a.startswith("--format") and "noheader" not in a
                                      for a in args):
            text = text.split("\n", 1)[1]
        first = False
        sys.stdout.write(text)
        sys.stdout.flush()
        time.sleep(period)


def answer(node: SimulatedNode, args: list[str],  # noqa: PLR0912 - a branch per option
           load: Load | None = None) -> str:
    """The text nvidia-smi would print for `args`; raises UsageError otherwise."""
    query_fields: list[str] | None = None
    app_fields: list[str] | None = None
    options: set[str] = set()
    indices = list(range(node.count))
    index = 0
    while index < len(args):
        arg = args[index]
        if arg.startswith("--query-gpu"):
            value, index = _option_value(args, index)
            query_fields = [f.strip() for f in value.split(",") if f.strip()]
        elif arg.startswith("--query-compute-apps"):
            value, index = _option_value(args, index)
            app_fields = [f.strip() for f in value.split(",") if f.strip()]
        elif arg.startswith("--format"):
            value, index = _option_value(args, index)
            options = {o.strip() for o in value.split(",")}
        elif arg in ("-i", "--id") or arg.startswith("--id="):
            value, index = _option_value(args, index)
            indices = [int(i) for i in value.split(",") if i.strip().isdigit()]
            if not indices or any(i >= node.count for i in indices):
                raise UsageError(f"No devices were found matching {value!r}")
        elif arg == "--version":
            return node.retext(node.capture.section("capabilities", "version"))
        elif arg in ("-L", "--list-gpus"):
            return gpu_list(node, indices)
        elif arg in ("-q", "--query"):
            index += 1
            if query_fields is None and app_fields is None and index >= len(args):
                return full_query(node, indices)
        elif arg == "topo" and args[index + 1:index + 2] == ["-m"]:
            return node.capture.section("capabilities", "topo -m")
        else:
            raise UsageError(f"unsupported arguments: {' '.join(args)}")
    if query_fields is not None:
        return query_gpu(node, query_fields, indices, options, load)
    if app_fields is not None:
        return query_apps(node, app_fields, options)
    if not args:
        return node.retext(node.capture.section("idle", "nvidia-smi (default table)"))
    raise UsageError(f"unsupported arguments: {' '.join(args)}")


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) < 2 or args[0] != "--state":
        sys.stderr.write("usage: fake_nvidia_smi --state FILE [nvidia-smi arguments]\n")
        return 2
    node = load_node(Path(args[1]))
    if node is None:
        sys.stdout.write(DRIVER_FAILURE)
        return EXIT_DRIVER_FAILURE
    if node.count == 0:
        sys.stdout.write("No devices were found\n")
        return 6
    try:
        period, rest = loop_period(args[2:])
        if period is not None:
            stream(node, rest, period)
        sys.stdout.write(answer(node, rest))
    except UsageError as error:
        sys.stderr.write(f"nvidia-smi (simulated by gpucluster sandbox): {error}\n")
        return 2
    except (BrokenPipeError, KeyboardInterrupt):  # the reader went away, or Ctrl-C
        return 0
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONDONTWRITEBYTECODE", "1")
    sys.exit(main())
