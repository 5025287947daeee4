"""The inventory: one YAML file -> frozen, validated dataclasses.

model (the values), load (finding and reading the file), validate (every problem at
once), schema (each key's type and check), resolve (ssh_config and defaults per host).

Layout of the file (every key is described in inventory.example.yaml):

    cluster:  settings for the whole cluster (rendezvous port, python, env, image...)
    defaults: per-host settings applied to every host unless the host overrides them
    groups:   named selections of hosts, written as host ranges
    hosts:    one entry per host or per host range (`gpu[01-16]`)

Validation collects every problem before raising, so a user fixes a file in one pass.
"""

from gpucluster.inventory.load import DEFAULT_INVENTORY, INVENTORY_ENV_VAR, find_inventory, load
from gpucluster.inventory.model import (
    ClusterSettings,
    Host,
    Inventory,
    SlurmSettings,
    SmokeSettings,
    is_ip,
)
from gpucluster.inventory.resolve import LOCAL_ADDRESSES
from gpucluster.inventory.schema import CLUSTER_KEYS, HOST_KEYS, SLURM_KEYS, SMOKE_KEYS

__all__ = [
    "CLUSTER_KEYS",
    "DEFAULT_INVENTORY",
    "HOST_KEYS",
    "INVENTORY_ENV_VAR",
    "LOCAL_ADDRESSES",
    "SLURM_KEYS",
    "SMOKE_KEYS",
    "ClusterSettings",
    "Host",
    "Inventory",
    "SlurmSettings",
    "SmokeSettings",
    "find_inventory",
    "is_ip",
    "load",
]
