from __future__ import annotations

import pytest

from gpucluster.errors import GpuclusterError
from gpucluster.selection import comma_list, select

KNOWN = ["parity", "ssh-mesh", "hosts", "firewall"]


def test_only_and_skip_keep_the_known_order() -> None:
    assert select(KNOWN, None, None, "step") == KNOWN
    assert select(KNOWN, ["firewall", "parity"], None, "step") == ["parity", "firewall"]
    assert select(KNOWN, None, ["hosts"], "step") == ["parity", "ssh-mesh", "firewall"]


def test_unknown_names_are_one_error_listing_the_known() -> None:
    with pytest.raises(GpuclusterError, match="unknown step fire, nope; known: parity"):
        select(KNOWN, ["fire"], ["nope"], "step")
    with pytest.raises(GpuclusterError) as typo:
        select(KNOWN, ["firewal", "ssh_mesh"], None, "step")
    assert str(typo.value) == ("unknown step firewal, ssh_mesh; known: parity, ssh-mesh, "
                               "hosts, firewall (fix: did you mean firewall, ssh-mesh?)")


def test_comma_list() -> None:
    assert comma_list(" a, b,,c ", "--only") == ["a", "b", "c"]
    assert comma_list(None, "--only") is None
    for nothing in ("", " , "):  # `--only "$STEPS"` with the variable unset: not "all"
        with pytest.raises(GpuclusterError, match=rf"^--only {nothing!r} names nothing "):
            comma_list(nothing, "--only")
