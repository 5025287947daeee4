"""The all-reduce smoke test: a benchmark run through torchrun on every node, the way
jobs run, so it also proves rendezvous, hostnames and interfaces."""
