"""A local cluster of network-namespace nodes, each with a real sshd and simulated GPUs."""
