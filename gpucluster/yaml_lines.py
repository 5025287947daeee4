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


# The most nodes a document's aliases may add: hundreds of hosts that merge a shared
# mapping (`<<: *gpu`) are a few thousand; nested aliases (a "billion laughs") reach
# this after a handful of levels, long before memory runs out.
MAX_ALIAS_NODES = 100_000


class AliasError(yaml.composer.ComposerError):
    """Valid YAML whose aliases this loader will not expand; `fix` says what to write."""

    def __init__(self, problem: str, mark: Any, fix: str) -> None:
        super().__init__(None, None, problem, mark)
        self.fix = fix


class _LineLoader(yaml.SafeLoader):
    """SafeLoader whose maps and sequences are LineDict and LineList. An alias (`*gpu`,
    `<<: *gpu`) becomes a copy of what its anchor holds, so no two places of the
    inventory share one object; copies are counted, and an alias inside its own anchor
    is refused, so that nothing expands without bound."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self.open_anchors: set[str] = set()
        self.alias_nodes = 0

    def compose_node(self, parent: Any, index: Any) -> Any:
        event = self.peek_event()  # type: ignore[no-untyped-call]
        if isinstance(event, yaml.AliasEvent):
            if event.anchor in self.open_anchors:
                raise AliasError(f"the alias *{event.anchor} is inside its own anchor "
                                 f"&{event.anchor}: it would never end", event.start_mark,
                                 "move the alias out of the anchored value")
            if event.anchor not in self.anchors:
                raise AliasError(f"the alias *{event.anchor} has no anchor "
                                 f"&{event.anchor} above it", event.start_mark,
                                 f"mark the value to repeat with &{event.anchor} before "
                                 f"its first use: YAML reads from the top")
            node = self.anchors[event.anchor]
            self.get_event()  # type: ignore[no-untyped-call]
            self.alias_nodes += _size(node)
            if self.alias_nodes > MAX_ALIAS_NODES:
                raise AliasError(f"the aliases up to here expand to more than "
                                 f"{MAX_ALIAS_NODES} values", event.start_mark,
                                 "write the values out, or nest fewer aliases")
            return _copy(node)
        anchor = getattr(event, "anchor", None)
        if anchor is None:
            return super().compose_node(parent, index)
        self.open_anchors.add(anchor)
        try:
            return super().compose_node(parent, index)
        finally:
            self.open_anchors.discard(anchor)


def _size(node: yaml.Node) -> int:
    if isinstance(node, yaml.SequenceNode):
        return 1 + sum(_size(item) for item in node.value)
    if isinstance(node, yaml.MappingNode):
        return 1 + sum(_size(key) + _size(value) for key, value in node.value)
    return 1


def _copy(node: yaml.Node) -> yaml.Node:
    """A node tree of its own (the marks shared: they are only read)."""
    if isinstance(node, yaml.SequenceNode):
        return yaml.SequenceNode(node.tag, [_copy(item) for item in node.value],
                                 node.start_mark, node.end_mark, node.flow_style)
    if isinstance(node, yaml.MappingNode):
        return yaml.MappingNode(node.tag, [(_copy(k), _copy(v)) for k, v in node.value],
                                node.start_mark, node.end_mark, node.flow_style)
    return yaml.ScalarNode(node.tag, node.value, node.start_mark, node.end_mark,
                           getattr(node, "style", None))


def _construct_map(loader: _LineLoader, node: yaml.MappingNode) -> Iterator[LineDict]:
    data = LineDict()
    data.line = node.start_mark.line + 1
    yield data
    own = sum(key.tag != "tag:yaml.org,2002:merge" for key, _ in node.value)
    loader.flatten_mapping(node)  # what `<<: *gpu` merges comes first, its own keys win
    merged = len(node.value) - own
    own_keys: set[Any] = set()
    for position, (key_node, value_node) in enumerate(node.value):
        key = loader.construct_object(key_node, deep=True)
        try:
            hash(key)
        except TypeError:
            raise yaml.constructor.ConstructorError(
                None, None, "a mapping key must be a plain value", key_node.start_mark
            ) from None
        line = key_node.start_mark.line + 1
        if position >= merged:  # a key merged in may be overridden; its own, once
            if key in own_keys:
                data.repeated_keys.append((key, line))
            own_keys.add(key)
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
