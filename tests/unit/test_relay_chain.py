"""The image relay's pacing (provision/relay_chain.py), with hops as real local shells
that speak the relay's reports: the controller says `go` only once every hop is ready
and linked, and a hop that fails before that stops the chain with nothing sent."""

from __future__ import annotations

import io
from pathlib import Path

from gpucluster.inventory import Host
from gpucluster.provision.logged import CommandLog, LoggedConnection
from gpucluster.provision.relay_chain import Hop, RelayChain
from gpucluster.remote.local import LocalConnection

# A hop in miniature: ready (and its link's word, as the next hop's shell would say it),
# then `go` or nothing; the first hop counts what follows `go` on its stdin.
HOP = """printf '@@gpc relay-ready %s\\n' {name} >&2
{linked}
IFS= read -r beat && [ "$beat" = go ] || {{ echo "{name} stopped" > {mark}; exit 1; }}
printf '@@gpc loaded %s %s\\n' {name} "$(wc -c | tr -d ' ')" >&2
"""


def _hops(tmp_path: Path, scripts: dict[str, str]) -> list[Hop]:
    log = CommandLog(tmp_path / "log")
    return [Hop(Host(name, "localhost", "me"),
                LoggedConnection(LocalConnection(name), log), script)
            for name, script in scripts.items()]


def _hop(tmp_path: Path, name: str, next_hop: str | None) -> str:
    linked = f"printf '@@gpc relay-linked %s\\n' {next_hop} >&2" if next_hop else ""
    return HOP.format(name=name, linked=linked, mark=tmp_path / f"{name}.stopped")


def test_go_comes_once_every_hop_is_ready_and_linked_then_the_stream_reaches_the_first(
        tmp_path: Path) -> None:
    scripts = {"a": _hop(tmp_path, "a", "b"), "b": _hop(tmp_path, "b", "c"),
               "c": "sleep 0.5\n" + _hop(tmp_path, "c", None)}  # the last is slow to start
    chain = RelayChain(_hops(tmp_path, scripts), on_progress=None)
    problems = chain.run(io.BytesIO(b"x" * 100_000))
    assert problems == {}
    assert chain.stopped is None
    # The first hop read the whole stream after `go`; the others, only the end of stdin.
    assert chain.loaded == {"a": "100000", "b": "0", "c": "0"}
    assert not list(tmp_path.glob("*.stopped"))


def test_a_hop_that_fails_before_go_stops_every_hop_with_nothing_sent(tmp_path: Path
                                                                      ) -> None:
    scripts = {"a": _hop(tmp_path, "a", "b"),
               "b": "echo 'ssh: connect to host c port 22: Connection refused' >&2; "
                    "printf '@@gpc relay-link-ended c 255\\n' >&2; sleep 1; exit 1",
               "c": _hop(tmp_path, "c", None)}
    chain = RelayChain(_hops(tmp_path, scripts), on_progress=None)
    problems = chain.run(io.BytesIO(b"x" * 1000))
    assert chain.stopped is not None and "nothing was sent" in chain.stopped
    assert "b could not link to c: ssh: connect to host c port 22: Connection refused" \
        in chain.stopped
    assert problems == {"a": chain.stopped, "b": chain.stopped, "c": chain.stopped}
    assert chain.loaded == {}
    # The waiting hops were told to stop (their stdin ended) instead of waiting for ever.
    assert {p.read_text() for p in tmp_path.glob("*.stopped")} == {"a stopped\n",
                                                                  "c stopped\n"}
