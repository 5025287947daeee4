# Passes stdin to stdout, reporting the bytes seen so far on stderr in gpucluster's
# report format ("@@gpc progress NODE BYTES [done]"), at most twice a second.
# os.read returns what has arrived (up to 1 MiB) instead of waiting for a full buffer,
# and os.write passes it on at once: a hop that held 1 MiB back before forwarding it
# delayed every later hop by the time that MiB took on the wire.
import os
import sys
import time

node = sys.argv[1]
total, last = 0, 0.0
while chunk := os.read(0, 1 << 20):
    view = memoryview(chunk)
    while view:
        view = view[os.write(1, view):]
    total += len(chunk)
    if time.time() - last > 0.5:
        last = time.time()
        print("@@gpc progress", node, total, file=sys.stderr, flush=True)
print("@@gpc progress", node, total, "done", file=sys.stderr, flush=True)
