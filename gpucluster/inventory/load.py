"""Finding the inventory file and reading it: size, encoding and YAML errors become
`file:line` problems; the document then goes to the validator."""

from __future__ import annotations

import os
import re
from pathlib import Path

import yaml

from gpucluster.errors import GpuclusterError, InventoryError, Problem
from gpucluster.inventory.model import Inventory
from gpucluster.inventory.validate import Validator
from gpucluster.yaml_lines import AliasError, load_with_lines

INVENTORY_ENV_VAR = "GPUCLUSTER_INVENTORY"
DEFAULT_INVENTORY = "inventory.yaml"
_MAX_FILE_BYTES = 10 * 1024 * 1024


def find_inventory(explicit: str | None) -> Path:
    """-i/--inventory, then $GPUCLUSTER_INVENTORY, then ./inventory.yaml."""
    if explicit:
        return Path(explicit)
    from_env = os.environ.get(INVENTORY_ENV_VAR)
    if from_env:
        if not Path(from_env).exists():  # else the fix would name -i, which was not given
            raise GpuclusterError(f"{from_env}: inventory file not found, named by "
                                  f"${INVENTORY_ENV_VAR} (fix: point ${INVENTORY_ENV_VAR} "
                                  f"at the inventory, or pass -i/--inventory PATH)")
        return Path(from_env)
    if Path(DEFAULT_INVENTORY).is_file():
        return Path(DEFAULT_INVENTORY)
    raise GpuclusterError(
        f"no inventory: pass -i/--inventory PATH, set ${INVENTORY_ENV_VAR}, "
        f"or create ./{DEFAULT_INVENTORY} (gpucluster inventory example > "
        f"{DEFAULT_INVENTORY} writes a commented one to start from)"
    )


def load(path: str | Path) -> Inventory:
    """Read and validate an inventory file; raises InventoryError listing every problem."""
    path = Path(path)
    text = _read_text(path)
    try:
        document = load_with_lines(text)
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None) or getattr(error, "context_mark", None)
        line = mark.line + 1 if mark is not None else None
        reason = getattr(error, "problem", None) or str(error).splitlines()[0]
        if _indented_by_tab(text, line):
            raise InventoryError([Problem(
                str(path), line, "a tab indents this line: YAML indents with spaces only",
                "replace the tab with spaces")]) from None
        if isinstance(error, AliasError):  # valid YAML, but not expanded here
            raise InventoryError([Problem(str(path), line, reason, error.fix)]) from None
        message, fix = _plainly(reason)
        raise InventoryError([Problem(str(path), line, message, fix)]) from None
    except (ValueError, TypeError, RecursionError) as error:
        # PyYAML raises ValueError for a tagged value it cannot read: `!!int abc`.
        raise InventoryError(
            [Problem(str(path), None, f"not valid YAML: {error}", "quote the value")]
        ) from None
    return Validator(path).inventory(document)


def _plainly(reason: str) -> tuple[str, str]:
    """PyYAML's words for valid YAML an inventory does not take, said as that; the
    rest is a syntax error."""
    if reason.startswith("but found another document"):
        return ("a second YAML document starts here (a `---` line): an inventory is one "
                "document", "remove the `---` line, or merge the documents into one")
    tag = re.match(r"could not determine a constructor for the tag '(.*)'", reason)
    if tag:
        written = tag[1].replace("tag:yaml.org,2002:", "!!")  # as the file has it
        return (f"the YAML tag {written} is not one an inventory reads",
                "write the value itself: an inventory has no includes or custom tags")
    return f"not valid YAML: {reason}", "fix the YAML syntax"


def _indented_by_tab(text: str, line: int | None) -> bool:
    """PyYAML says "found character '\\t' that cannot start any token", which names the
    character, not the cause."""
    lines = text.splitlines()
    if line is None or not 0 < line <= len(lines):
        return False
    content = lines[line - 1]
    return "\t" in content[:len(content) - len(content.lstrip(" \t"))]


def _read_text(path: Path) -> str:
    try:
        size = path.stat().st_size
        if size > _MAX_FILE_BYTES:
            raise InventoryError([Problem(str(path), None, f"file is {size} bytes",
                                          "an inventory is a small YAML file")])
        raw = path.read_bytes()
    except FileNotFoundError:
        raise InventoryError([Problem(str(path), None, "inventory file not found",
                                      "check the path given to -i/--inventory")]) from None
    except IsADirectoryError:
        raise InventoryError([Problem(str(path), None, "is a directory",
                                      "pass the inventory YAML file itself")]) from None
    except OSError as error:
        raise InventoryError([Problem(str(path), None, f"cannot read: {error.strerror}",
                                      "check the file's permissions")]) from None
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as error:
        line = raw[: error.start].count(b"\n") + 1
        raise InventoryError([Problem(str(path), line, "not UTF-8 text",
                                      "save the inventory as UTF-8")]) from None
