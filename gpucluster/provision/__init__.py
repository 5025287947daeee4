"""`gpucluster provision`: idempotent steps that make a cluster right. Each step checks,
plans, applies and re-checks, per node; a second run changes nothing."""
