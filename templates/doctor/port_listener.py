# Doctor's test listener on the head's rendezvous port: argv PORT LIFETIME EXPECTED NODE
# [GPUS] (a job's CUDA_VISIBLE_DEVICES, indices: a job on none of them has its own port).
# Reports (gpucluster's format) "@@gpc ready PID", or "@@gpc busy job ID" / "@@gpc busy
# ERRNO" when the port is taken; then accepts EXPECTED connections or waits LIFETIME s.
import glob
import os
import socket
import sys
import time

port, lifetime, expected = int(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3])
# A gpucluster job on this node owns the port, or is about to bind it: never take it
# from under a starting torchrun (it would turn client of this listener and hang).
suffix = ("@" + sys.argv[4]).encode()
ours = set(sys.argv[5].split(",")) if len(sys.argv) > 5 and sys.argv[5] else set()


def apart(entries):
    """A job's process on GPUs none of which is ours: launch --gpus side by side."""
    for entry in entries:
        if entry.startswith(b"CUDA_VISIBLE_DEVICES="):
            theirs = set(entry[21:].decode(errors="replace").replace(" ", "").split(","))
            return bool(ours) and all(g.isdigit() for g in theirs) and not ours & theirs
    return False


for path in glob.glob("/proc/[0-9]*/environ"):
    try:
        entries = open(path, "rb").read().split(b"\0")
    except OSError:
        continue
    if apart(entries):
        continue
    for entry in entries:
        if entry.startswith(b"GPUCLUSTER_JOB=") and entry.endswith(suffix):
            print("@@gpc busy job", entry[15:-len(suffix)].decode(), flush=True)
            sys.exit(0)
server = socket.socket()
server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
try:
    server.bind(("0.0.0.0", port))
    server.listen(128)
except OSError as error:
    print("@@gpc busy", error.errno, flush=True)
    sys.exit(0)
print("@@gpc ready", os.getpid(), flush=True)
server.settimeout(0.2)
deadline, seen = time.time() + lifetime, 0
while time.time() < deadline and seen < expected:
    try:
        peer, address = server.accept()
        seen += 1
        peer.close()
    except TimeoutError:
        pass
