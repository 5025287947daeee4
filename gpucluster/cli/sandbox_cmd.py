"""`gpucluster sandbox up|down|status`: a local cluster of network-namespace nodes."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from gpucluster.cli.options import JsonOption, stderr_console, stdout_console
from gpucluster.cli.views import common
from gpucluster.sandbox import spec as sandbox_spec

app = typer.Typer(help="A local cluster of network-namespace nodes with real sshd "
                       "and simulated GPUs (needs root).", no_args_is_help=True)

NameOption = Annotated[str, typer.Option(
    "--name", help="Sandbox name (several can coexist on different subnets).")]


@app.command("up")
def up(
    nodes: Annotated[int, typer.Option("--nodes", "-n", help="Number of nodes (node1..nodeN).")
                     ] = 4,
    name: NameOption = sandbox_spec.DEFAULT_NAME,
    subnet: Annotated[str, typer.Option(help="A /24 inside 198.18.0.0/15.")
                      ] = sandbox_spec.DEFAULT_SUBNET,
    gpu_model: Annotated[str, typer.Option(
        "--gpu-model", help="Which real capture the simulated GPUs replay (h100, h200, l40s...)")
    ] = "h100",
    gpus: Annotated[list[str] | None, typer.Option(
        "--gpus", metavar="[NODE=]COUNT",
        help="Simulated GPUs per node (default 8); NODE=0 means no GPU. Repeatable.")] = None,
    driver: Annotated[list[str] | None, typer.Option(
        "--driver", metavar="[NODE=]VERSION",
        help="Stage a driver version, or NODE=failed for a driver nvidia-smi cannot reach.")
    ] = None,
    clock_slowdown: Annotated[list[str] | None, typer.Option(
        "--clock-slowdown", metavar="[NODE=]REASON",
        help="Hold every GPU's clocks down for a reason NVIDIA's driver reports: hw_thermal, "
             "sw_thermal, hw_slowdown, hw_power_brake or power_cap.")] = None,
    link_rate: Annotated[list[str] | None, typer.Option(
        "--link-rate", metavar="[NODE=]RATE",
        help="Shape links with tc (e.g. 1gbit; node4=100mbit). A plain rate also shapes the "
             "controller's own link into the sandbox.")] = None,
    mtu: Annotated[list[str] | None, typer.Option(
        "--mtu", metavar="[NODE=]MTU",
        help="A node's MTU (e.g. node3=9000: jumbo frames) where the sandbox's switch "
             "carries 1500: full-size packets are dropped, as doctor's path-mtu finds.")
    ] = None,
    latency: Annotated[str, typer.Option(
        help="tbf latency: the most a packet may wait in a shaped link's queue.")] = "50ms",
    write_inventory: Annotated[Path, typer.Option(
        "--write-inventory", metavar="PATH", help="Where to write the sandbox's inventory.")
    ] = Path("sandbox.yaml"),
    user: Annotated[str | None, typer.Option(
        "--user", metavar="NAME",
        help="Reach the nodes as this ordinary user (created on every node, key login) "
             "instead of root, as cloud images' 'ubuntu' user is.")] = None,
    sudo: Annotated[str, typer.Option(
        "--sudo", metavar="nopasswd|password|none",
        help="What sudo the --user gets.")] = "nopasswd",
    shared_home_option: Annotated[bool, typer.Option(
        "--shared-home",
        help="One home for the --user on every node, as an NFS home is.")] = False,
) -> None:
    """Bring up (or repair, or restage) a sandbox cluster; idempotent."""
    from gpucluster.sandbox import cluster

    login = sandbox_spec.build_login(user, sudo, shared_home_option)
    wanted = sandbox_spec.build(name, subnet, nodes, gpu_model, gpus or [], driver or [],
                                link_rate or [], latency, login, clock_slowdown, mtu)
    from gpucluster.cli.views.sandbox import print_up

    result = cluster.up(wanted, write_inventory, say=stderr_console().print)
    print_up(stdout_console(), result)


@app.command("status")
def status(name: NameOption = sandbox_spec.DEFAULT_NAME, json_output: JsonOption = False
           ) -> None:
    """Show each node: namespace, sshd, simulated GPUs, link shaping."""
    from gpucluster.cli.views.sandbox import print_status, status_payload
    from gpucluster.sandbox import cluster

    spec, rows = cluster.status(name)
    if json_output:
        common.print_json(stdout_console(), status_payload(name, spec, rows))
    else:
        print_status(stdout_console(), name, spec, rows)
    if not all(r.up for r in rows):
        raise typer.Exit(1)


@app.command("down")
def down(name: NameOption = sandbox_spec.DEFAULT_NAME) -> None:
    """Remove everything the sandbox made: processes, namespaces, links, files."""
    from gpucluster.cli.views.sandbox import print_down
    from gpucluster.sandbox import cluster

    print_down(stdout_console(), name, cluster.down(name))
