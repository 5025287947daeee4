"""Doctor's checks, one module per concern; importing this package registers them all,
in the order doctor shows them."""

from gpucluster.doctor.checks import reachability  # isort: skip
from gpucluster.doctor.checks import gpu  # isort: skip
from gpucluster.doctor.checks import gpu_health  # isort: skip
from gpucluster.doctor.checks import network  # isort: skip
from gpucluster.doctor.checks import mesh  # isort: skip
from gpucluster.doctor.checks import ssh_mesh  # isort: skip
from gpucluster.doctor.checks import system  # isort: skip
from gpucluster.doctor.checks import scheduler  # isort: skip

__all__ = ["gpu", "gpu_health", "mesh", "network", "reachability", "scheduler", "ssh_mesh",
           "system"]
