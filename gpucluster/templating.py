"""Files written to nodes are rendered from templates/ (shipped inside the wheel)."""

from __future__ import annotations

import shlex
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpucluster.packaged import packaged_path

if TYPE_CHECKING:
    import jinja2


def template_dir() -> Path:
    """The wheel puts templates/ inside the package; a source checkout has it beside it."""
    return packaged_path("templates")


@cache
def _environment() -> jinja2.Environment:
    import jinja2  # here, not above: ~25 ms of every command's start-up, for the few that render

    from gpucluster.remote.connection import shell_path
    from gpucluster.template_cache import bytecode_cache

    environment = jinja2.Environment(  # noqa: S701 - shell and config files, not HTML
        loader=jinja2.FileSystemLoader(template_dir()),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
        bytecode_cache=bytecode_cache(),
    )
    environment.filters["quote"] = lambda value: shlex.quote(str(value))
    # A path on the nodes (cluster.python, work_dir): quoted, its leading ~/ expanded there.
    environment.filters["node_path"] = lambda value: shell_path(str(value))
    return environment


def script_text(name: str) -> str:
    """A script sent to nodes as it is (templates/<name>, e.g. a Python helper)."""
    return (template_dir() / name).read_text()


def render(template: str, **context: Any) -> str:
    """Render templates/<name>; a missing variable is an error, never an empty string."""
    return _environment().get_template(template).render(**context)
