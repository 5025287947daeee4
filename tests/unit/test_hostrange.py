from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpucluster import hostrange
from gpucluster.errors import HostRangeError


@pytest.mark.parametrize(("pattern", "expected"), [
    ("gpu01", ["gpu01"]),
    ("gpu[01-03]", ["gpu01", "gpu02", "gpu03"]),
    ("node[1-4,7]", ["node1", "node2", "node3", "node4", "node7"]),
    ("gpu[08-11]", ["gpu08", "gpu09", "gpu10", "gpu11"]),
    ("r[1-2]n[1-2]", ["r1n1", "r1n2", "r2n1", "r2n2"]),
    ("10.0.0.[11-13]", ["10.0.0.11", "10.0.0.12", "10.0.0.13"]),
    ("gpu[1-2].example.com", ["gpu1.example.com", "gpu2.example.com"]),
])
def test_expand(pattern: str, expected: list[str]) -> None:
    assert hostrange.expand(pattern) == expected


@pytest.mark.parametrize("pattern", ["gpu[3-1]", "gpu[a-b]", "gpu[1-", "gpu]1[", "gpu[1,,2]",
                                     "gpu[]", "x[1-99999999]",
                                     # Digits to str.isdigit(), not to a user: '²' made
                                     # int() raise (a traceback), Arabic-Indic 1-3 named
                                     # node[1-3].
                                     "gpu[1-²]", "gpu[²]", "gpu[\u0661-\u0663]"])
def test_bad_patterns_raise_our_error(pattern: str) -> None:
    with pytest.raises(HostRangeError):
        hostrange.expand(pattern)


@pytest.mark.parametrize(("pattern", "fix"), [
    ("node[3-1]", "[1-3]"), ("gpu[04-01]", "[01-04]"), ("n[1,,2]", "remove the extra comma"),
    ("n[1-2", "close each [ with ], e.g. node[1-4]"), ("n[a-b]", "digits, like [01-16]"),
    ("n[1-999999]", "at most 100,000 hosts; is a digit extra?")])
def test_each_bad_pattern_names_its_fix_apart(pattern: str, fix: str) -> None:
    with pytest.raises(HostRangeError) as raised:
        hostrange.expand(pattern)
    assert raised.value.fix == fix
    assert str(raised.value) == f"{raised.value.reason} (fix: {fix})"


def test_expand_list_keeps_order_and_drops_repeats() -> None:
    assert hostrange.expand_list("gpu[01-02],login1,gpu01") == ["gpu01", "gpu02", "login1"]


@pytest.mark.parametrize(("names", "folded"), [
    (["node1", "node2", "node3"], "node[1-3]"),
    (["node1", "node3", "node4"], "node[1,3-4]"),
    (["gpu09", "gpu10", "gpu11"], "gpu[09-11]"),
    (["gpu07"], "gpu07"),
    (["login", "node2", "node1"], "login,node[1-2]"),
])
def test_fold(names: list[str], folded: str) -> None:
    assert hostrange.fold(names) == folded


@given(st.sets(st.integers(min_value=0, max_value=300), min_size=1),
       st.sampled_from(["node", "gpu-", "rack1n"]), st.sampled_from([0, 2, 3]))
def test_fold_then_expand_round_trips(numbers: set[int], prefix: str, width: int) -> None:
    names = sorted(f"{prefix}{str(n).zfill(width)}" for n in numbers)
    assert sorted(hostrange.expand_list(hostrange.fold(names))) == names
