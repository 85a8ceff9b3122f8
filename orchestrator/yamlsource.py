"""Load a YAML file while remembering the line of every key, so that errors can point at `file:line`.

`load_yaml(path)` returns a `YamlSource`: the plain Python data (dicts, lists, scalars, exactly as `yaml.safe_load`
would give) plus a map from each path inside the document (a tuple of keys and list indices) to its line.
Duplicate keys in a mapping, which PyYAML silently collapses, are refused, and so are documents larger than
`MAX_BYTES` or whose aliases expand to more than `MAX_NODES` nodes (a "billion laughs" of nested anchors is refused
in milliseconds instead of filling the memory).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from orchlib.errors import OrchError

Loc = tuple[str | int, ...]
MAX_BYTES = 1 << 20  # a sweep file of 1 MiB is already a generated one
MAX_NODES = 100_000  # nodes after alias expansion; the paper's largest sweep file has a few hundred
PLAIN_TAGS = ("tag:yaml.org,2002:map", "tag:yaml.org,2002:seq")


class YamlLimitError(OrchError):
    """A document larger than the limits (bytes, or nodes once aliases are expanded)."""


@dataclass
class YamlSource:
    """A parsed YAML document and the line of each of its nodes (1-based)."""

    path: Path
    data: Any
    lines: dict[Loc, int] = field(default_factory=dict)

    def line(self, loc: Loc) -> int | None:
        """The line of `loc`, or of its nearest enclosing node that has one."""
        loc = tuple(loc)
        while loc:
            if loc in self.lines:
                return self.lines[loc]
            loc = loc[:-1]
        return self.lines.get(())

    def where(self, loc: Loc) -> str:
        """`file:line: dotted.key` for error messages."""
        line = self.line(loc)
        position = f"{self.path}:{line}" if line else str(self.path)
        key = format_loc(loc)
        return f"{position}: {key}" if key else position

    def error(self, loc: Loc, message: str) -> OrchError:
        """An `OrchError` located at `loc`."""
        return OrchError(f"{self.where(loc)}: {message}")


def format_loc(loc: Loc) -> str:
    """`("grid", "task", 2)` -> `grid.task[2]`."""
    text = ""
    for part in loc:
        if isinstance(part, str) and not part.isprintable():
            part = repr(part)  # a key with a newline stays on the message's one line
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text


def load_yaml(path: str | Path) -> YamlSource:
    """Parse `path`; raise `OrchError` with `file:line:column` on syntax errors or duplicate keys."""
    path = Path(path)
    try:
        if path.is_dir():
            raise OrchError(f"{path}: is a directory, not a YAML file")
        with path.open("rb") as handle:
            raw = handle.read(MAX_BYTES + 1)
        text = raw.decode("utf-8")
    except OSError as err:
        raise OrchError(f"{path}: cannot read sweep file ({err.strerror})") from None
    except UnicodeDecodeError as err:
        raise OrchError(f"{path}: not a UTF-8 text file (byte {err.start})") from None
    return parse_yaml(text, path)


def parse_yaml(text: str, path: str | Path = "<string>") -> YamlSource:
    """Parse YAML `text` (named `path` in messages)."""
    path = Path(path)
    if len(text) > MAX_BYTES:
        raise YamlLimitError(f"{path}: larger than {MAX_BYTES >> 20} MiB; refused")
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        source = YamlSource(path=path, data=None)
        if node is not None:
            source.data = _convert(loader, node, (), source, [MAX_NODES])
        return source
    except yaml.MarkedYAMLError as err:
        mark = err.problem_mark or err.context_mark
        where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark else str(path)
        problem = err.problem or err.context or "invalid YAML"
        raise OrchError(f"{where}: YAML syntax error: {problem}") from None
    except yaml.YAMLError as err:
        raise OrchError(f"{path}: YAML syntax error: {err}") from None
    finally:
        loader.dispose()


def _convert(loader: yaml.SafeLoader, node: yaml.Node, loc: Loc, source: YamlSource, budget: list[int]) -> Any:
    budget[0] -= 1
    if budget[0] < 0:
        raise YamlLimitError(f"{source.path}:{node.start_mark.line + 1}: more than {MAX_NODES} nodes once its "
                             f"aliases are expanded (nested anchors?); refused")
    source.lines.setdefault(loc, node.start_mark.line + 1)
    if isinstance(node, yaml.MappingNode | yaml.SequenceNode) and node.tag not in PLAIN_TAGS:
        raise OrchError(f"{source.path}:{node.start_mark.line + 1}: {format_loc(loc) or 'document'}: unsupported "
                        f"YAML tag {node.tag!r}")
    if isinstance(node, yaml.MappingNode):
        loader.flatten_mapping(node)  # resolves `<<:` merge keys
        result: dict[Any, Any] = {}
        for key_node, value_node in node.value:
            if not isinstance(key_node, yaml.ScalarNode):
                raise OrchError(f"{source.path}:{key_node.start_mark.line + 1}: {format_loc(loc) or 'document'}: "
                                f"keys must be plain values, not lists or mappings")
            key = loader.construct_object(key_node, deep=True)
            if key in result:
                raise OrchError(
                    f"{source.path}:{key_node.start_mark.line + 1}: {format_loc((*loc, key))}: duplicate key "
                    f"{key!r} (first set on line {source.lines[(*loc, key)]})"
                )
            source.lines[(*loc, key)] = key_node.start_mark.line + 1
            result[key] = _convert(loader, value_node, (*loc, key), source, budget)
        return result
    if isinstance(node, yaml.SequenceNode):
        return [_convert(loader, item, (*loc, index), source, budget) for index, item in enumerate(node.value)]
    return loader.construct_object(node, deep=True)
