"""gpucluster bundle: a whole cluster's (and a job's) diagnostics in one archive."""
