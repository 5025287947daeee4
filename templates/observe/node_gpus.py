# gpucluster: a node's GPUs, their processes and its network, for `top`, `exporter`
# and `reap`. Runs with the node's python3 and nothing else of ours.
#   stream INTERVAL_MS [PEER]               one JSON frame per line, every interval, from
#                                           nvidia-smi's own loops (-lms): no process
#                                           is started per sample; PEER's route names
#                                           the cluster interface
#   processes JOBS_DIR NODE                 one JSON object: the GPU processes, with the
#                                           job, ours or Slurm's (and whether it still
#                                           runs), of each
#   end GRACE_S PID...                      TERM, grace, KILL; what is left, as JSON
import contextlib
import ipaddress
import json
import os
import pwd
import signal
import socket
import subprocess
import sys
import threading
import time

MARKER = "GPUCLUSTER_JOB="
GPU_FIELDS = ("index,uuid,name,pci.bus_id,utilization.gpu,memory.used,memory.total,"
              "temperature.gpu,power.draw,ecc.errors.uncorrected.volatile.total")
# DCGM exporter's other default gauges that nvidia-smi reads (a driver that lacks one of
# them, an older one, is asked GPU_FIELDS alone), and what holds the clocks down (a
# bitmask, under the name every driver takes)
EXTRA_GPU_FIELDS = ("clocks.current.sm,clocks.current.memory,temperature.memory,"
                    "utilization.memory,utilization.encoder,utilization.decoder,"
                    "clocks_throttle_reasons.active")
GPU_KEYS = ("index", "uuid", "name", "bus_id", "util", "mem_used", "mem_total", "temp",
            "power", "ecc", "sm_clock", "mem_clock", "mem_temp", "mem_util", "enc_util",
            "dec_util", "clock_events")
UNKNOWN_FIELD = "is not a valid field to query"  # nvidia-smi: Field "x" is not a valid...
APP_FIELDS = "gpu_uuid,pid,used_memory"
FORMAT = "--format=csv,noheader,nounits"
IB = "/sys/class/infiniband"
FIRST_WINDOW_S = 0.1


def number(text):
    try:
        value = float(text)
    except ValueError:
        return None  # [N/A], [Not Supported]
    return int(value) if value.is_integer() else value


def read(path, default=""):
    try:
        with open(path, "rb") as handle:
            return handle.read().decode(errors="replace")
    except OSError:
        return default


def owner(pid):
    """User, state (R, S, D...), and from the environment the job marker and ranks."""
    status = read(f"/proc/{pid}/status")
    uid = next((line.split()[1] for line in status.splitlines() if line.startswith("Uid:")),
               None)
    try:
        user = pwd.getpwuid(int(uid)).pw_name if uid is not None else "?"
    except KeyError:
        user = uid
    state = read(f"/proc/{pid}/stat").rpartition(")")[2].split()[:1]
    environ = {}
    try:
        with open(f"/proc/{pid}/environ", "rb") as handle:
            for entry in handle.read().split(b"\0"):
                name, _, value = entry.decode(errors="replace").partition("=")
                if name in ("GPUCLUSTER_JOB", "RANK", "LOCAL_RANK", "SLURM_JOB_ID",
                            "GPC_JOB_DIR"):
                    environ[name] = value
        readable = True
    except OSError:
        readable = False  # another user's: not ours to attribute
    return {"user": user, "state": state[0] if state else "?", "readable": readable,
            "job": environ.get("GPUCLUSTER_JOB", "").split("@")[0] or None,
            "rank": number(environ.get("RANK", "-")),
            "local_rank": number(environ.get("LOCAL_RANK", "-")),
            "slurm_job": environ.get("SLURM_JOB_ID") or None,
            "job_dir": environ.get("GPC_JOB_DIR") or None}


def sent(info):
    """A process's owner as the controller gets it: its job dir serves quiet() here only."""
    return {name: value for name, value in info.items() if name != "job_dir"}


def quiet(owners):
    """Each job's seconds since its newest output or heartbeat here: the newer of its
    node.log and heartbeat file, in the job dir its processes carry (gpucluster/quiet.py)."""
    found, now = {}, time.time()
    for info in owners:
        job, job_dir = info.get("job"), info.get("job_dir")
        if job and job_dir and job not in found:
            times = []
            for name in ("node.log", "heartbeat"):
                with contextlib.suppress(OSError):
                    times.append(os.stat(f"{job_dir}/{name}").st_mtime)
            if times:
                found[job] = round(max(0.0, now - max(times)), 1)
    return found


def job_running(jobs_dir, job, node):
    """The job's torchrun leader on this node is alive and still carries its marker. A
    marker without a job dir (a smoke test's: it has none) has nothing that tells it
    ended: running, never a leftover to end, as doctor's probe reads it."""
    if not os.path.isdir(f"{jobs_dir}/{job}/{node}"):
        return True
    leader = read(f"{jobs_dir}/{job}/{node}/leader.pid").strip()
    marker = f"{MARKER}{job}@{node}".encode()
    try:
        with open(f"/proc/{leader}/environ", "rb") as handle:
            return marker in handle.read().split(b"\0")
    except (OSError, ValueError):
        return False


# A Slurm job's states once it has ended (squeue -j lists every state); any other is a
# job Slurm still has. gpucluster/slurm_states.ENDED_JOB_STATES, copied: this file runs
# on nodes alone.
SLURM_ENDED = ("BOOT_FAIL", "CANCELLED", "COMPLETED", "DEADLINE", "FAILED", "NODE_FAIL",
               "OUT_OF_MEMORY", "PREEMPTED", "REVOKED", "TIMEOUT")


def slurm_job_running(job):
    """True while Slurm has the job, False once it has ended (or been forgotten), None
    when squeue cannot say: such a process is then left alone."""
    try:
        done = subprocess.run(["squeue", "-h", "-j", job, "-o", "%T"], check=False,
                              capture_output=True, text=True, timeout=15)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if "Invalid job id" in done.stderr:
        return False
    state = done.stdout.strip()
    if done.returncode != 0 or not state:
        return None
    return state not in SLURM_ENDED


def apps_now():
    done = subprocess.run(["nvidia-smi", f"--query-compute-apps={APP_FIELDS}", FORMAT],
                          check=False, capture_output=True, text=True, timeout=30)
    if done.returncode != 0:
        raise RuntimeError((done.stdout + done.stderr).strip()[-300:] or "nvidia-smi failed")
    return [line.split(", ") for line in done.stdout.splitlines() if line.count(", ") == 2]


def gpu_indexes():
    """GPU uuid -> index (nvidia-smi's, CUDA's by default): what people call a GPU by."""
    with contextlib.suppress(OSError, subprocess.TimeoutExpired):
        done = subprocess.run(["nvidia-smi", "--query-gpu=index,uuid", FORMAT], check=False,
                              capture_output=True, text=True, timeout=30)
        pairs = [line.split(", ") for line in done.stdout.splitlines()]
        return {p[1]: number(p[0]) for p in pairs if len(p) == 2 and done.returncode == 0}
    return {}


def processes(jobs_dir, node):
    try:
        rows = apps_now()
    except FileNotFoundError:  # no NVIDIA driver (a CPU node): no GPU for anything to hold
        return {"error": "", "processes": [], "no_gpus": True}
    except (OSError, RuntimeError, subprocess.TimeoutExpired) as error:
        return {"error": str(error), "processes": []}
    indexes = gpu_indexes() if rows else {}
    found, running, slurm_running = [], {}, {}
    for uuid, pid, mib in rows:
        info = owner(pid)
        job, slurm_job = info["job"], info["slurm_job"]
        if job and job not in running:
            running[job] = job_running(jobs_dir, job, node)
        if slurm_job and slurm_job not in slurm_running:
            slurm_running[slurm_job] = slurm_job_running(slurm_job)
        found.append({"pid": int(pid), "gpu_uuid": uuid, "gpu_index": indexes.get(uuid),
                      "used_mib": number(mib), **sent(info),
                      "job_running": running.get(job) if job else None,
                      "slurm_job_running": slurm_running.get(slurm_job) if slurm_job
                      else None})
    return {"processes": found}


def end(grace_s, pids):
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in pids:
            with contextlib.suppress(OSError):
                os.kill(pid, sig)
        deadline = time.monotonic() + (grace_s if sig == signal.SIGTERM else 3)
        while time.monotonic() < deadline and any(alive(p) for p in pids):
            time.sleep(0.1)
    left = [{"pid": p, **owner(p)} for p in pids if alive(p)]
    return {"left": left}


def alive(pid):
    state = read(f"/proc/{pid}/stat").rpartition(")")[2].split()[:1]
    return bool(state) and state[0] not in ("Z", "X")


class Loop(threading.Thread):
    """One nvidia-smi loop; keeps the newest row per key and when it came."""

    def __init__(self, query, key, width, interval_ms):
        super().__init__(daemon=True)
        self.rows, self.error = {}, ""
        self.key, self.width = key, width
        try:
            self.process = subprocess.Popen(
                ["nvidia-smi", query, FORMAT, "-lms", str(interval_ms)],
                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        except OSError as error:  # a node without NVIDIA's driver: its CPUs still count
            self.process = None
            self.error = (f"no GPUs: nvidia-smi: {error.strerror or error} (a node without "
                          f"the NVIDIA driver; gpucluster doctor says more)")

    def stop(self):
        if self.process is not None:
            self.process.kill()

    def run(self):
        if self.process is None:
            return
        for line in self.process.stdout:
            fields = line.rstrip("\n").split(", ")
            if len(fields) == self.width:
                self.rows[fields[self.key]] = (fields, time.monotonic())
            else:
                self.error = line.strip()
        self.error = self.error or f"nvidia-smi exited {self.process.wait()}"

    def wait_first(self, deadline):
        while not self.rows and not self.error and time.monotonic() < deadline:
            time.sleep(0.02)

    def fresh(self, within_s):
        now = time.monotonic()
        return [fields for fields, came in list(self.rows.values()) if now - came <= within_s]


def gpu_loop(fields, interval_ms):
    return Loop(f"--query-gpu={fields}", 0, fields.count(",") + 1, interval_ms)


def gpu_record(fields):
    """A row of the GPU loop by GPU_KEYS (fewer on a driver without the extra fields)."""
    bitmask = GPU_KEYS.index("clock_events")
    values = [number(fields[0]), *fields[1:4], *[number(v) for v in fields[4:bitmask]],
              *[hexadecimal(v) for v in fields[bitmask:]]]
    return dict(zip(GPU_KEYS[:len(values)], values, strict=True))


def hexadecimal(text):
    try:
        return int(text, 16)  # 0x0000000000000040
    except ValueError:
        return None  # [N/A]


def interface_to(peer):
    """The interface towards a peer; given the node's own address (a one-node cluster),
    the interface holding it rather than the loopback its route takes."""
    try:
        address = socket.getaddrinfo(peer, None)[0][4][0]  # a name, or an address
    except OSError:
        return None
    try:
        done = subprocess.run(["ip", "-o", "route", "get", address], check=False,
                              capture_output=True, text=True, timeout=10)
        words = done.stdout.split()
        if words[:1] == ["local"]:
            done = subprocess.run(["ip", "-o", "addr", "show", "to", address], check=False,
                                  capture_output=True, text=True, timeout=10)
            words = ["dev", done.stdout.split()[1]] if len(done.stdout.split()) > 1 else []
    except (OSError, subprocess.TimeoutExpired):  # no iproute2: a minimal image
        return routed_interface(address)
    return words[words.index("dev") + 1] if "dev" in words else None


def routed_interface(address):
    """The interface of the kernel's longest IPv4 route holding `address`, from
    /proc/net/route (each address the hex of a network-order word read in the machine's
    byte order); lo for a loopback address, whose routes that file leaves out."""
    try:
        target = ipaddress.IPv4Address(address)
    except ValueError:
        return None  # IPv6: not in that file
    if target.is_loopback:
        return "lo"
    best = (-1, None)
    for line in read("/proc/net/route").splitlines()[1:]:
        fields = line.split()
        if len(fields) < 8:
            continue
        destination, mask = (int.from_bytes(bytes.fromhex(f), sys.byteorder)
                             for f in (fields[1], fields[7]))
        if int(target) & mask == destination and bin(mask).count("1") > best[0]:
            best = (bin(mask).count("1"), fields[0])
    return best[1]


def counters(interface):
    """(rx, tx) bytes of the interface, and of each InfiniBand port."""
    found = {}
    for line in read("/proc/net/dev").splitlines()[2:]:
        name, _, rest = line.partition(":")
        if name.strip() == interface:
            fields = rest.split()
            found[interface] = (int(fields[0]), int(fields[8]))
    for device in os.listdir(IB) if os.path.isdir(IB) else []:
        for port in os.listdir(f"{IB}/{device}/ports"):
            base = f"{IB}/{device}/ports/{port}/counters"
            rx = number(read(f"{base}/port_rcv_data", "x"))
            tx = number(read(f"{base}/port_xmit_data", "x"))
            if rx is not None and tx is not None:
                found[f"{device}/{port}"] = (rx * 4, tx * 4)  # counted in 4-byte words
    return found


# Root's reader of the kernel log for a sudo user: it ends when our end of its stdin
# closes, however this sampler ends (its own death signal would not reach it through
# sudo, which is set-user-ID).
KMSG_THROUGH_SUDO = 'cat /dev/kmsg & reader=$!; read -r _; kill "$reader"'
TYPED_SUDO = "typed-sudo"  # stream's last argument when the password comes on stdin


class Xid(threading.Thread):
    """New NVRM Xid lines from the kernel log: /dev/kmsg itself (root, or
    kernel.dmesg_restrict=0), else through sudo (a sudo user, as doctor reads it):
    sudo -n, or with `password` (--ask-sudo-pass), tried once before the reader's sudo
    reads it from its stdin."""

    def __init__(self, password=None):
        super().__init__(daemon=True)
        self.readable, self.events, self.since_us = True, [], 0
        try:
            kmsg = open("/dev/kmsg", "rb", buffering=0)
            kmsg.seek(0, os.SEEK_END)
            self.next_record = lambda: kmsg.read(8192)  # a record per read
        except OSError:
            lines = self._through_sudo(password)
            self.readable = lines is not None
            self.next_record = lines.readline if lines else None  # a record per line

    def _through_sudo(self, password):
        try:
            if sudo_answers(["-n"]):
                sudo, first = ["sudo", "-n"], b""
            elif password is not None and sudo_answers(["-S", "-k", "-p", ""], password):
                # -k: the reader's sudo asks too, so it reads the line before sh does
                sudo, first = ["sudo", "-S", "-k", "-p", ""], f"{password}\n".encode()
            else:
                return None
            # cat starts at the buffer's oldest record: those before now are skipped.
            with open("/proc/uptime") as uptime:
                self.since_us = int(float(uptime.read().split()[0]) * 1e6)
            self.reader = subprocess.Popen([*sudo, "sh", "-c", KMSG_THROUGH_SUDO],
                                           stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                           stderr=subprocess.DEVNULL)
            if first:
                self.reader.stdin.write(first)
                self.reader.stdin.flush()
        except (OSError, subprocess.TimeoutExpired):
            return None
        return self.reader.stdout

    def run(self):
        while self.readable:
            try:
                records = self.next_record()
            except OSError:
                continue  # EPIPE: records overwritten before we read them
            if not records:
                return  # the reader through sudo ended
            self.record(records.decode(errors="replace"))

    def record(self, record):
        prefix, _, message = record.partition(";")  # level,seq,usec,flags;text
        fields = prefix.split(",")
        logged_us = number(fields[2]) if len(fields) > 2 else None
        if logged_us is not None and logged_us < self.since_us:
            return
        if "NVRM: Xid" in message:  # NVRM: Xid (PCI:0000:18:00): 79, ...
            bus = message.partition("PCI:")[2].partition(")")[0]
            code = number(message.partition("): ")[2].partition(",")[0].strip())
            self.events.append([bus, code])


def sudo_answers(options, password=None):
    """Whether `sudo OPTIONS true` works; with `password` on its stdin (one try)."""
    typed = None if password is None else f"{password}\n".encode()
    return subprocess.run(["sudo", *options, "true"], input=typed,
                          stdin=subprocess.DEVNULL if typed is None else None,
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                          timeout=5, check=False).returncode == 0


def stream(interval_ms, peer, typed_sudo=False):
    loops = [gpu_loop(f"{GPU_FIELDS},{EXTRA_GPU_FIELDS}", interval_ms),
             Loop(f"--query-compute-apps={APP_FIELDS}", 1, 3, interval_ms)]
    try:
        frames(loops, interval_ms, peer, typed_sudo)
    finally:  # however the sampler ends, its loops end too: the processes' loop prints
        for loop in loops:  # nothing while there are none, so no closed pipe would end it
            loop.stop()


def frames(loops, interval_ms, peer, typed_sudo):
    """A frame on stdout every interval from the loops (the GPUs', the processes'), until
    stdout or stdin closes."""
    interval = interval_ms / 1000
    gpus, apps = loops
    # --ask-sudo-pass: the password is stdin's first line; the rest is the controller's
    # session, whose end ends this sampler
    xid = Xid(sys.stdin.readline().rstrip("\n") if typed_sudo else None)
    for thread in (gpus, apps, xid):
        thread.start()

    def quit_with_the_controller():  # stdin ends when the SSH session does
        sys.stdin.read()
        for loop in loops:
            loop.stop()
        os._exit(0)
    threading.Thread(target=quit_with_the_controller, daemon=True).start()
    interface = interface_to(peer) if peer else None
    # The counters and the clock read together: the first frame's rates cover exactly
    # the time its bytes were counted in.
    before, last, owners = counters(interface), time.monotonic(), {}
    # The processes loop prints nothing while there are none, so its silence cannot say
    # "none yet": one query of its own makes the first frames complete.
    with contextlib.suppress(OSError, RuntimeError, subprocess.TimeoutExpired):
        for row in apps_now():
            apps.rows.setdefault(row[1], (row, time.monotonic()))
    deadline = time.monotonic() + max(5.0, 3 * interval)
    gpus.wait_first(deadline)  # the first frame as soon as the GPUs have answered,
    if UNKNOWN_FIELD in gpus.error:
        loops[0] = gpus = gpu_loop(GPU_FIELDS, interval_ms)
        gpus.start()
        gpus.wait_first(deadline)
    # and its rates over FIRST_WINDOW_S at least: over a few ms one burst reads as a flood
    time.sleep(max(0.0, last + min(FIRST_WINDOW_S, interval) - time.monotonic()))
    while True:
        now = time.monotonic()
        after = counters(interface)
        rates = {name: [round((after[name][0] - old[0]) / (now - last)),
                        round((after[name][1] - old[1]) / (now - last))]
                 for name, old in before.items() if name in after and now > last}
        before, last = after, now
        rows = gpus.fresh(1.5 * interval + 1)
        running = apps.fresh(1.5 * interval + 1)
        owners = {pid: owners.get(pid) or owner(pid) for _, pid, _ in running}
        frame = {
            "t": time.time(), "interface": interface, "rates": rates,
            "load": [number(v) for v in read("/proc/loadavg").split()[:3]],
            "cpus": os.cpu_count(), "error": "" if rows else gpus.error,
            "gpus": [gpu_record(fields) for fields in rows],
            "processes": [{"gpu_uuid": u, "pid": int(p), "used_mib": number(m),
                           **sent(owners[p])} for u, p, m in running],
            "xid": xid.events if xid.readable else None,
            "quiet": quiet(owners.values()),
        }
        sys.stdout.write(json.dumps(frame) + "\n")
        sys.stdout.flush()
        time.sleep(max(0.0, interval - (time.monotonic() - now)))


def main(args):
    if args[0] == "stream":
        stream(int(args[1]), args[2] if len(args) > 2 else "", TYPED_SUDO in args[3:])
    elif args[0] == "processes":
        print(json.dumps(processes(args[1], args[2])))
    elif args[0] == "end":
        print(json.dumps(end(float(args[1]), [int(p) for p in args[2:]])))


if __name__ == "__main__":
    try:
        main(sys.argv[1:])
    except (BrokenPipeError, KeyboardInterrupt):
        os._exit(0)
