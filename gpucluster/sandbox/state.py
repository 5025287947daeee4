"""A sandbox's state file (`/var/lib/gpucluster/sandbox/NAME/state.json`): what `up`
built, read back by `status` and `down`, and which sandboxes are up."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from gpucluster.errors import SandboxError
from gpucluster.sandbox import node
from gpucluster.sandbox.spec import NodeLogin, NodeSpec, SandboxSpec


def state_file(name: str) -> Path:
    return node.sandbox_dir(name) / "state.json"


def read_state(name: str) -> dict[str, Any] | None:
    try:
        state: dict[str, Any] = json.loads(state_file(name).read_text())
    except (OSError, ValueError):
        return None
    return state


def spec_from_state(state: dict[str, Any]) -> SandboxSpec:
    try:
        raw = dict(state["spec"])
        raw["nodes"] = tuple(NodeSpec(**n) for n in raw["nodes"])
        raw["login"] = NodeLogin(**raw["login"]) if raw.get("login") else None
        return SandboxSpec(**raw)
    except (KeyError, TypeError):
        raise SandboxError(f"sandbox state {state.get('spec', {}).get('name', '?')!r} was "
                           f"written by another gpucluster version: take it down with "
                           f"`gpucluster sandbox down --name NAME` and bring it up again"
                           ) from None


def load_spec(name: str) -> SandboxSpec:
    state = read_state(name)
    if state is None or "spec" not in state:
        others = [o for o in sandboxes_up() if o != name]
        if others:  # `sandbox status` looks for the default name
            raise SandboxError(f"no sandbox {name!r} is up; up: {', '.join(others)} (fix: "
                               f"--name {others[0]})")
        raise SandboxError(f"no sandbox {name!r} is up (start one with "
                           f"`sudo gpucluster sandbox up`)")
    return spec_from_state(state)


def sandboxes_up() -> list[str]:
    """The names of the sandboxes whose state is on this machine."""
    if not node.STATE_ROOT.is_dir():
        return []
    return sorted(path.name for path in node.STATE_ROOT.iterdir()
                  if "spec" in (read_state(path.name) or {}))
