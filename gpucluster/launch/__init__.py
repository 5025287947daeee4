"""`gpucluster launch` and job control: torchrun on every node, detached, streamed, stopped."""
