"""A GPU load for scripts/device/check that is not a gpucluster job: bf16 matrix
products for SECONDS, holding 4 GiB besides (`burn.py SECONDS`)."""

import sys
import time

import torch


def main(seconds: float) -> None:
    matrix = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    held = torch.empty(4 << 30, dtype=torch.uint8, device="cuda")
    end = time.time() + seconds
    while time.time() < end:
        for _ in range(20):
            matrix = (matrix @ matrix).clamp_(-1, 1)
        torch.cuda.synchronize()
    del held


if __name__ == "__main__":
    main(float(sys.argv[1]))
