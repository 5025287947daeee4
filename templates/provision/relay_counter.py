# Passes stdin to stdout, reporting the bytes seen so far on stderr in gpucluster's
# report format ("@@gpc progress NODE BYTES [done]"), at most twice a second.
import sys
import time

node, read, write = sys.argv[1], sys.stdin.buffer.read, sys.stdout.buffer.write
total, last = 0, 0.0
while chunk := read(1 << 20):
    write(chunk)
    total += len(chunk)
    if time.time() - last > 0.5:
        last = time.time()
        print("@@gpc progress", node, total, file=sys.stderr, flush=True)
sys.stdout.flush()
print("@@gpc progress", node, total, "done", file=sys.stderr, flush=True)
