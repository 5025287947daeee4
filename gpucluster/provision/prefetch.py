"""Every step's reads, done ahead in one round trip per node (riding on the parity
gate's probe when it runs), so that a provision that finds everything right costs one
round trip per node instead of one per step.

A step lists the commands it will run to read (`Step.reads`); their results are primed
into the node's LoggedConnection, which answers each from them once. The first command
that was not read ahead (a write) drops what is left: it may have changed what they
read."""

from __future__ import annotations

import base64
import binascii
from collections.abc import Mapping, Sequence

from gpucluster.remote.result import CommandResult
from gpucluster.reports import Section
from gpucluster.templating import render

Read = tuple[str, bool]  # the command, and whether it runs under sudo


def script(reads: Sequence[Read]) -> str:
    return render("provision/prefetch.sh.j2", reads=list(reads))


def parse(host: str, found: Mapping[str, Section], reads: Sequence[Read]
          ) -> dict[Read, CommandResult]:
    """The results that arrived whole; a read missing or garbled is simply run later."""
    results = {}
    for index, read in enumerate(reads):
        section = found.get(f"read-{index}")
        if section is None:
            continue
        code, _, body = section.output.partition("\n")
        try:
            output = base64.b64decode(body.strip(), validate=True).decode("utf-8", "replace")
        except (binascii.Error, ValueError):
            continue
        if code.strip().lstrip("-").isdigit():
            results[read] = CommandResult(host, read[0], int(code), output, "", 0.0)
    return results


def unique(reads: Sequence[Read]) -> list[Read]:
    return list(dict.fromkeys(reads))
