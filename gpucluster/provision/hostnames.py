"""Node hostnames, vetted before they are written into every node's /etc/hosts,
~/.ssh/config and known_hosts.

A hostname comes from the node itself, so it is untrusted input: a fresh image named
`localhost`, clones that are all `ubuntu`, or a name with a newline (which would put a
`ProxyCommand` into every node's ssh config) must not reach those files. Only valid
DNS-style names are kept; loopback names, names that two nodes report, and names that
are another inventory host's are dropped, each with the reason said per node.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Mapping, Sequence

_LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
_HOSTNAME = re.compile(rf"{_LABEL}(?:\.{_LABEL})*")
LOOPBACK_NAMES = frozenset({"localhost", "localhost.localdomain", "ip6-localhost",
                            "ip6-loopback"})


def vet(reported: Mapping[str, str], inventory_names: Sequence[str]
        ) -> tuple[dict[str, str], dict[str, str]]:
    """(usable hostname per node, why a node's hostname was left out)."""
    counts = Counter(name.lower() for name in reported.values())
    usable: dict[str, str] = {}
    dropped: dict[str, str] = {}
    for node, name in reported.items():
        if len(name) > 253 or not _HOSTNAME.fullmatch(name):
            dropped[node] = f"its hostname {name[:60]!r} is not a valid host name"
        elif name.lower() in LOOPBACK_NAMES:
            dropped[node] = f"its hostname {name!r} is a loopback name"
        elif name == node:  # its own inventory name: whoever else claims it is wrong
            usable[node] = name
        elif name in inventory_names:
            dropped[node] = f"its hostname {name!r} is another inventory host's name"
        elif counts[name.lower()] > 1:
            dropped[node] = (f"its hostname {name!r} is reported by {counts[name.lower()]} "
                             f"nodes (cloned images?)")
        else:
            usable[node] = name
    for node, why in dropped.items():
        dropped[node] = (f"{why}: left out of /etc/hosts and ssh config; peers reach it as "
                         f"{node} (fix: hostnamectl set-hostname {node})")
    return usable, dropped
