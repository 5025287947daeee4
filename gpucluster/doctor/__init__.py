"""`gpucluster doctor`: gather each node's facts in one batched probe, then run checks,
per node and across nodes, each finding with a remedy."""
