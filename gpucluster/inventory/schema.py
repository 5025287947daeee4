"""Every inventory key: its expected type and the converter that checks it. A converter
returns the value or raises ValueError whose text is the fix to show."""

from __future__ import annotations

import math
import re
import reprlib
from collections.abc import Callable
from typing import Any

from gpucluster.env_names import is_env_name
from gpucluster.yaml_lines import as_written


def _quoted_number(value: Any) -> None:
    """`port: "22"`: YAML reads a string, and 'use a port number' would not say why."""
    if isinstance(value, str) and value.strip().isdigit():
        raise ValueError(f"write the number without quotes: {value.strip()}")


def _port(value: Any) -> int:
    _quoted_number(value)
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 65535:
        raise ValueError("use a port number from 1 to 65535")
    return int(value)


def _positive_int(value: Any) -> int:
    _quoted_number(value)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError("use a whole number, 0 or more")
    return int(value)


def _fanout(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 1024:
        raise ValueError("use a whole number from 1 to 1024")
    return int(value)


def _port_count(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 64:
        raise ValueError("use a whole number from 1 to 64 (one port per GPU of a node)")
    return int(value)


def _is_positive(value: Any) -> bool:
    """A number above 0 and finite: YAML reads `.inf` and `.nan` as floats, and nan
    passes any comparison's negation (a timeout of `nan s` reached the nodes)."""
    return (not isinstance(value, bool) and isinstance(value, (int, float))
            and math.isfinite(value) and value > 0)


def _seconds(value: Any) -> float:
    if not _is_positive(value):
        raise ValueError("use a number of seconds above 0")
    return float(value)


def _positive_number(value: Any) -> float:
    if not _is_positive(value):
        raise ValueError("use a number above 0")
    return float(value)


_BOOLEAN_TEXT = "quote it: YAML reads an unquoted yes/no, on/off or true/false as a boolean"


def _text(value: Any) -> str:
    if isinstance(value, bool):
        raise ValueError(_BOOLEAN_TEXT)
    if not isinstance(value, (str, int, float)):
        raise ValueError("use a plain string")
    text = as_written(value)
    if not text.strip():
        raise ValueError("use a non-empty string")
    return text


_LOGIN = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._@-]*\$?")


def _login(value: Any) -> str:
    """A login name as systems allow them (a domain user's `name@domain` too): it goes
    into ssh configs and sudo lines, where a space or `;` would be a different word."""
    text = _text(value)
    if not _LOGIN.fullmatch(text):
        raise ValueError("use a login name: letters, digits, '.', '_', '-' (and '@' for a "
                         "domain user)")
    return text


def _from_root_or_home(text: str, example: str) -> str:
    """A path on the nodes: from / or from the node user's home (~/, which the node's shell
    expands). A relative one would mean the home in a plain SSH command and the work dir
    inside a job, so it is refused rather than guessed."""
    if text == "~" or text.startswith(("/", "~/")):
        return text
    if text.startswith("~"):
        raise ValueError("start it with / or ~/ (the node user's home): ~NAME/ is not "
                         "expanded")
    raise ValueError(f"start it with / or ~/ (the node user's home), e.g. {example}")


def _node_dir(value: Any) -> str:
    text = _text(value)
    return _from_root_or_home(text, f"~/{text}")


def _node_program(value: Any) -> str:
    """A name the nodes' PATH finds, or a path as `_from_root_or_home` takes it."""
    text = _text(value)
    if "/" not in text:
        return text
    return _from_root_or_home(text, f"~/{text} (or a name on the nodes' PATH)")


def _connection(value: Any) -> str:
    if value not in ("auto", "ssh", "local"):
        raise ValueError("use one of: auto, ssh, local")
    return str(value)


def _torch_device(value: Any) -> str:
    if value not in ("cuda", "cpu"):
        raise ValueError("use cuda or cpu")
    return str(value)


def _flag(value: Any) -> bool:
    if not isinstance(value, bool):
        raise ValueError("use true or false")
    return value


class BadItem(ValueError):
    """One item of a mapping is wrong in a way "has a bad value" would not say."""

    def __init__(self, what: str, fix: str) -> None:
        super().__init__(fix)
        self.what = what


class ItemProblems(ValueError):
    """A mapping's bad items, each (item key as in the file, what is wrong, fix): said at
    each item's own line, all at once, rather than once at the mapping's key."""

    def __init__(self, problems: list[tuple[Any, str, str]]) -> None:
        super().__init__("; ".join(f"{as_written(key)} {what}" for key, what, _ in problems))
        self.problems = problems


def _items(value: Any, convert: Callable[[str, Any], str], shape: str) -> dict[str, str]:
    """A mapping of text to text, each item through `convert(key, item)`, which raises
    BadItem, or ValueError(fix) for a bad value."""
    if not isinstance(value, dict):
        raise ValueError(f"use a mapping of {shape}")
    converted: dict[str, str] = {}
    problems: list[tuple[Any, str, str]] = []
    for key, item in value.items():
        name = as_written(key)
        try:
            converted[name] = convert(name, item)
        except BadItem as error:
            problems.append((key, error.what, str(error)))
        except ValueError as error:
            problems.append((key, f"has a bad value {short_repr(item)}", str(error)))
    if problems:
        raise ItemProblems(problems)
    return converted


def short_repr(value: Any) -> str:
    """A short repr for messages, bounded however large or deep the value."""
    text = reprlib.repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _label(_name: str, item: Any) -> str:
    if item is None:
        raise BadItem("has no value", "give it a value, or remove the line")
    return _text(item)


def _labels(value: Any) -> dict[str, str]:
    return _items(value, _label, "label: value")


def _env_value(name: str, item: Any) -> str:
    if not is_env_name(name):
        raise BadItem("is not a valid environment variable name",
                      "use letters, digits and '_', not starting with a digit")
    if item is None:
        raise BadItem("has no value", f'write {name}: "" for an empty value, or remove the line')
    if isinstance(item, bool):
        return "1" if item else "0"
    if isinstance(item, str):
        return item  # "" and " " too: a variable may be set to anything
    if isinstance(item, int | float):
        return as_written(item)
    raise ValueError(f"give {name} one value: a string, a number or true/false")


def _env(value: Any) -> dict[str, str]:
    return _items(value, _env_value, "NAME: value")


GROUP_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]*")
GROUP_NAME_RULE = "letters, digits, '_', '.' and '-', not starting with '.' or '-'"


def is_group_name(name: Any) -> bool:
    """A group name `-g`, Ansible, genders and ClusterShell files all take as one word
    (an empty one could never be selected, a space or comma splits it in a genders file)."""
    return isinstance(name, str) and GROUP_NAME.fullmatch(name) is not None


def _group_names(value: Any) -> tuple[str, ...]:
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list) or not all(isinstance(i, str) for i in items):
        raise ValueError("use a group name or a list of group names")
    if not all(is_group_name(i) for i in items):
        raise ValueError(f"use group names of {GROUP_NAME_RULE}")
    return tuple(items)


Converter = Callable[[Any], Any]

_CLUSTER_NAME = re.compile(r"[a-z][a-z0-9-]{0,31}")


def _cluster_name(value: Any) -> str:
    if not isinstance(value, str) or not _CLUSTER_NAME.fullmatch(value):
        raise ValueError("use a short name of lowercase letters, digits and '-', starting "
                         "with a letter (it names files, blocks and firewall tags on nodes)")
    return value


CLUSTER_KEYS: dict[str, tuple[str, Converter]] = {
    "name": ("name", _cluster_name),
    "rendezvous_port": ("port", _port),
    "rendezvous_ports": ("integer", _port_count),
    "python": ("program", _node_program),
    "torchrun": ("program", _node_program),
    "env": ("mapping", _env),
    "image": ("string", _text),
    "work_dir": ("directory", _node_dir),
    "known_hosts": ("string", _text),
    "ssh_config": ("string", _text),
    "connect_timeout": ("seconds", _seconds),
    "command_timeout": ("seconds", _seconds),
    "fanout": ("integer", _fanout),
    "log_max_mb": ("integer", _positive_int),
}

HOST_KEYS: dict[str, tuple[str, Converter]] = {
    "name": ("string", _text),
    "address": ("string", _text),
    "user": ("login name", _login),
    "port": ("port", _port),
    "identity_file": ("string", _text),
    "jump_host": ("string", _text),
    "labels": ("mapping", _labels),
    "gpus": ("integer", _positive_int),
    "gpu_model": ("string", _text),
    "groups": ("list", _group_names),
    "connection": ("string", _connection),
    "torch_device": ("string", _torch_device),
    "spare": ("boolean", _flag),
}
DEFAULTS_KEYS = {k: v for k, v in HOST_KEYS.items() if k not in ("name", "address", "spare")}
# Keys a host may set to null to drop what `defaults` gave it.
NULLABLE_KEYS = frozenset({"jump_host", "identity_file", "gpus", "gpu_model"})
# Paths on the controller; paths on nodes (python, work_dir) are left as written, for the
# node's shell to expand a leading ~/.
PATH_KEYS = frozenset({"known_hosts", "ssh_config", "identity_file"})
SMOKE_KEYS: dict[str, tuple[str, Converter]] = {
    "min_busbw_gbps": ("number", _positive_number),
}

_SLURM_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_-]{0,39}")


def _slurm_name(value: Any) -> str:
    if not isinstance(value, str) or not _SLURM_NAME.fullmatch(value):
        raise ValueError("use a name of letters, digits, '_' and '-', starting with a letter")
    return value


def _port_range(value: Any) -> str:
    low, _, high = str(value).partition("-")
    if not (low.isdigit() and high.isdigit() and 1024 <= int(low) < int(high) <= 65535):
        raise ValueError("use LOW-HIGH, two ports from 1024 to 65535, e.g. 61000-61999")
    return f"{int(low)}-{int(high)}"


def _slurmd_timeout(value: Any) -> int:
    _quoted_number(value)
    if isinstance(value, bool) or not isinstance(value, int) or not 10 <= value <= 3600:
        raise ValueError("use whole seconds from 10 to 3600, e.g. 60")
    return int(value)


SLURM_KEYS: dict[str, tuple[str, Converter]] = {
    "enabled": ("boolean", _flag),
    "controller": ("string", _text),
    "partition": ("name", _slurm_name),
    "install": ("boolean", _flag),
    "cgroups": ("boolean", _flag),
    "srun_ports": ("port range", _port_range),
    "node_timeout": ("node timeout", _slurmd_timeout),
}
TOP_KEYS = ("cluster", "defaults", "groups", "hosts", "smoke", "slurm")
