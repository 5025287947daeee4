"""Running root-namespace tools (ip, tc, ssh-keygen) for the sandbox, with clear errors,
and ending the processes of a node's namespace."""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import shlex
import shutil
import signal
import subprocess
import time
from pathlib import Path

from gpucluster.errors import SandboxError
from gpucluster.procfs import gone

SSHD = Path("/usr/sbin/sshd")
_TOOLS = {"ip": "iproute2", "tc": "iproute2", "ssh-keygen": "openssh-client",
          "unshare": "util-linux", "nsenter": "util-linux"}


def require_root_and_tools() -> None:
    """One message naming everything missing, and the command that installs it."""
    missing = sorted({package for tool, package in _TOOLS.items() if shutil.which(tool) is None})
    if not SSHD.exists():
        missing.append("openssh-server")
    problems = []
    if os.geteuid() != 0:
        problems.append("must run as root (network namespaces and mounts need it): "
                        "use sudo gpucluster sandbox ...")
    if missing:
        problems.append(f"missing {', '.join(missing)}: install with "
                        f"apt-get install -y {' '.join(missing)}")
    if problems:
        raise SandboxError("sandbox " + "; ".join(problems))


def sh(*argv: str, check: bool = True, timeout: float = 30, stdin: str | None = None
       ) -> subprocess.CompletedProcess[str]:
    """Run a tool; a failure becomes SandboxError quoting the command and its error."""
    try:
        result = subprocess.run(argv, capture_output=True, text=True, timeout=timeout,
                                check=False, input=stdin)
    except subprocess.TimeoutExpired:
        raise SandboxError(f"`{shlex.join(argv)}` did not finish in {timeout:g}s") from None
    if check and result.returncode != 0:
        detail = (result.stderr or result.stdout).strip().splitlines()
        raise SandboxError(f"`{shlex.join(argv)}` failed: {detail[-1] if detail else 'no output'}")
    return result


def link_exists(name: str) -> bool:
    return sh("ip", "link", "show", "dev", name, check=False).returncode == 0


def host_networks() -> list[tuple[str, ipaddress.IPv4Interface]]:
    """Each IPv4 address of this machine's own interfaces, with the interface's name."""
    output = sh("ip", "-j", "-4", "addr", "show").stdout
    return [(link["ifname"], ipaddress.IPv4Interface(f"{a['local']}/{a['prefixlen']}"))
            for link in json.loads(output or "[]") for a in link.get("addr_info", [])
            if "local" in a]


def netns_list() -> list[str]:
    output = sh("ip", "netns", "list", check=False).stdout
    return [line.split()[0] for line in output.splitlines() if line.strip()]


def netns_pids(namespace: str) -> list[int]:
    output = sh("ip", "netns", "pids", namespace, check=False).stdout
    return [int(pid) for pid in output.split() if pid.isdigit()]


def write_atomically(path: Path, text: str, mode: int = 0o644) -> None:
    """Write a file via a temp file and rename, so a reader never sees half of it."""
    temp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    temp.write_text(text)
    temp.chmod(mode)
    temp.replace(path)


def tbf_burst(rate: str) -> str:
    """A token-bucket burst of about 10 ms at `rate` (at least 64 KiB), in bytes."""
    units = {"tbit": 1e12, "gbit": 1e9, "mbit": 1e6, "kbit": 1e3, "bit": 1,
             "tbps": 8e12, "gbps": 8e9, "mbps": 8e6, "kbps": 8e3, "bps": 8}
    for suffix, factor in units.items():
        if rate.endswith(suffix):
            bits_per_s = float(rate[: -len(suffix)]) * factor
            return str(max(64 * 1024, int(bits_per_s / 8 / 100)))
    raise SandboxError(f"cannot read link rate {rate!r}")


def shape(device: str, rate: str | None, latency: str, namespace: str | None = None) -> None:
    """Token-bucket shaping of what `device` sends; rate None removes it."""
    prefix = ["tc", "-n", namespace] if namespace else ["tc"]
    if rate is None:
        sh(*prefix, "qdisc", "del", "dev", device, "root", check=False)
        return
    sh(*prefix, "qdisc", "replace", "dev", device, "root", "tbf", "rate", rate,
       "burst", tbf_burst(rate), "latency", latency)


def set_mtu(namespace: str, device: str, mtu: int | None) -> None:
    """The node's own MTU; the bridge's ports, like a switch's, stay at 1500 and drop
    larger frames. Above 1500, one TCP segment per packet: the kernel's segmentation
    offload would otherwise hand the bridge 64 KiB packets it does not check against
    its MTU, so a bulk transfer would pass where a real switch drops every frame."""
    sh("ip", "-n", namespace, "link", "set", "dev", device, "mtu", str(mtu or 1500),
       "gso_max_segs", "1" if mtu and mtu > 1500 else "65535")


def kill_namespace(namespace: str, grace_s: float = 3.0) -> None:
    """Every process of the namespace: TERM, then KILL what is left after the grace."""
    pids = netns_pids(namespace)
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        deadline = time.monotonic() + grace_s
        while pids and time.monotonic() < deadline:
            pids = [p for p in pids if not gone(p)]
            time.sleep(0.05)
        if not pids:
            return
    raise SandboxError(f"processes {pids} of {namespace} survived SIGKILL")
