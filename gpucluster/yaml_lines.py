"""YAML loading that remembers where each mapping key and list item came from.

Validation errors must name `file:line`; plain `yaml.safe_load` forgets lines, so
this loader builds dict/list subclasses that carry them.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import yaml


class LineDict(dict[Any, Any]):
    """A mapping with the 1-based line of itself, of each key, and of repeated keys."""

    line: int = 0

    def __init__(self) -> None:
        super().__init__()
        self.key_lines: dict[Any, int] = {}
        self.repeated_keys: list[tuple[Any, int]] = []

    def line_of(self, key: Any) -> int:
        return self.key_lines.get(key, self.line)


class LineList(list[Any]):
    """A sequence with the 1-based line of itself and of each item."""

    line: int = 0

    def __init__(self) -> None:
        super().__init__()
        self.item_lines: list[int] = []

    def line_of(self, index: int) -> int:
        return self.item_lines[index] if index < len(self.item_lines) else self.line


class _LineLoader(yaml.SafeLoader):
    """SafeLoader whose maps and sequences are LineDict and LineList, and which refuses
    aliases: an inventory needs none, and nested ones (a "billion laughs") expand to
    more than any memory when a value is looked at."""

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()  # type: ignore[no-untyped-call]
            raise yaml.composer.ComposerError(
                None, None, "YAML aliases (*name) are not allowed in an inventory: write "
                "the value out", event.start_mark)
        return super().compose_node(parent, index)


def _construct_map(loader: _LineLoader, node: yaml.MappingNode) -> Iterator[LineDict]:
    data = LineDict()
    data.line = node.start_mark.line + 1
    yield data
    loader.flatten_mapping(node)
    for key_node, value_node in node.value:
        key = loader.construct_object(key_node, deep=True)
        try:
            hash(key)
        except TypeError:
            raise yaml.constructor.ConstructorError(
                None, None, "a mapping key must be a plain value", key_node.start_mark
            ) from None
        line = key_node.start_mark.line + 1
        if key in data:
            data.repeated_keys.append((key, line))
        data.key_lines[key] = line
        data[key] = loader.construct_object(value_node, deep=True)


class WrittenInt(int):
    """An int that keeps its text as written: YAML reads `010` as 8 and `01` as 1, but a
    key whose value is a string (a name, a label, an env value) means the text."""

    written: str


class WrittenFloat(float):
    """A float that keeps its text as written: `PYTHON_VERSION: 3.10` is 3.1 to YAML."""

    written: str


def _construct_int(loader: _LineLoader, node: yaml.ScalarNode) -> WrittenInt:
    number = WrittenInt(loader.construct_yaml_int(node))
    number.written = node.value
    return number


def _construct_float(loader: _LineLoader, node: yaml.ScalarNode) -> WrittenFloat:
    number = WrittenFloat(loader.construct_yaml_float(node))
    number.written = node.value
    return number


def as_written(value: Any) -> str:
    """A scalar's text as the file has it (a number's too), else str()."""
    written = getattr(value, "written", None)
    return written if isinstance(written, str) else str(value)


def _construct_timestamp(loader: _LineLoader, node: yaml.ScalarNode) -> str:
    """No inventory key takes a date: `RUN_DATE: 2024-01-01` means the text (PyYAML would
    give a date, which no text key takes, and fail on `2024-13-45`)."""
    return str(node.value)


def _construct_seq(loader: _LineLoader, node: yaml.SequenceNode) -> Iterator[LineList]:
    data = LineList()
    data.line = node.start_mark.line + 1
    yield data
    for item in node.value:
        data.item_lines.append(item.start_mark.line + 1)
        data.append(loader.construct_object(item, deep=True))


_LineLoader.add_constructor("tag:yaml.org,2002:map", _construct_map)
_LineLoader.add_constructor("tag:yaml.org,2002:seq", _construct_seq)
_LineLoader.add_constructor("tag:yaml.org,2002:int", _construct_int)
_LineLoader.add_constructor("tag:yaml.org,2002:float", _construct_float)
_LineLoader.add_constructor("tag:yaml.org,2002:timestamp", _construct_timestamp)


def load_with_lines(text: str) -> Any:
    """Parse one YAML document; raises yaml.YAMLError (with a mark) on bad syntax."""
    return yaml.load(text, Loader=_LineLoader)  # noqa: S506 - a SafeLoader subclass
