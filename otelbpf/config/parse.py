"""A config file's text as YAML, safely: size, depth and alias-expanded size are checked on
the event stream before a document is built, duplicate keys are refused, and every error
names the file, line and column.

A file is at most ``MAX_CONFIG_BYTES`` (1 MiB), nested at most ``MAX_CONFIG_DEPTH`` (32)
levels, and at most ``MAX_CONFIG_NODES`` (100,000) values once YAML aliases are expanded, so
no file (an alias bomb, /dev/zero) can exhaust the host. ``node_at`` finds where an option
was written, for the line numbers of validation errors."""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any

import yaml

from otelbpf.config.default import EXAMPLE_HINT
from otelbpf.config.errors import ConfigError, OptionPath
from otelbpf.config.units import format_size


class _Loader(yaml.SafeLoader):
    """SafeLoader that refuses duplicate keys (PyYAML keeps the last one silently), builds each
    collection whole (so a recursive alias is refused, marked, instead of building a cycle that
    later walks recurse into forever), and turns any value PyYAML cannot build (a 5,000-digit
    int, ``2001-02-30``, ``!!int abc``) into an error at its line and column."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self.deep_construct = True

    def construct_object(self, node: yaml.Node, deep: bool = False) -> Any:
        if node in self.recursive_objects:
            raise yaml.constructor.ConstructorError(
                None, None, "a recursive alias (*name inside the &name it refers to) builds no value", node.start_mark
            )
        try:
            return super().construct_object(node, deep)
        except yaml.MarkedYAMLError:
            raise
        except (ValueError, TypeError, KeyError, AttributeError, IndexError, OverflowError) as exc:
            tag = node.tag.removeprefix("tag:yaml.org,2002:")
            raise yaml.constructor.ConstructorError(
                None, None, f"cannot build this {tag} value ({type(exc).__name__}: {exc})", node.start_mark
            ) from None

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, yaml.Mark] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node, deep=True)
            if not isinstance(key, Hashable):
                continue
            if key in seen:
                first = seen[key].line + 1
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {key!r} (first written on line {first})", key_node.start_mark
                )
            seen[key] = key_node.start_mark
        return super().construct_mapping(node, deep)


#: Limits checked before a document is built, so that no config can exhaust the host: a
#: real config is a few KiB, ~8 levels deep and a few hundred nodes. ``MAX_CONFIG_NODES``
#: counts nodes as aliases expand them (an alias bomb's 10 levels of 10 aliases are 10^10).
MAX_CONFIG_BYTES = 1 << 20
MAX_CONFIG_DEPTH = 32
MAX_CONFIG_NODES = 100_000


def check_shape(text: str, source: str) -> None:
    """Size, nesting depth and alias-expanded node count, on the event stream (which PyYAML
    produces with a loop and bounded memory; building the document recurses and expands
    aliases). Raises ConfigError at the first limit passed."""
    if len(text) > MAX_CONFIG_BYTES:
        raise ConfigError(source, [f"{source}: larger than {format_size(MAX_CONFIG_BYTES)}: not a config file"])
    anchors: dict[str, int] = {}
    open_nodes: list[list[Any]] = [[None, 0]]  # [anchor, nodes so far] per open collection
    # yaml.parse: the loader's event loop, typed; the loader is disposed when the loop ends or raises.
    for event in yaml.parse(text, Loader=yaml.SafeLoader):
        if isinstance(event, yaml.CollectionStartEvent):
            open_nodes.append([event.anchor, 1])
            if len(open_nodes) - 1 > MAX_CONFIG_DEPTH:
                _shape_error(source, event, f"nested more than {MAX_CONFIG_DEPTH} levels deep")
            continue
        if isinstance(event, yaml.CollectionEndEvent):
            anchor, count = open_nodes.pop()
        elif isinstance(event, yaml.ScalarEvent):
            anchor, count = event.anchor, 1
        elif isinstance(event, yaml.AliasEvent):
            anchor, count = None, anchors.get(event.anchor or "", 1)
        else:
            continue
        if anchor is not None:
            anchors[anchor] = count
        open_nodes[-1][1] += count
        if open_nodes[-1][1] > MAX_CONFIG_NODES:
            _shape_error(
                source,
                event,
                f"more than {MAX_CONFIG_NODES} values once YAML aliases (*name) "
                "are expanded: an alias bomb, or a config that is not one",
            )


def _shape_error(source: str, event: yaml.Event, what: str) -> None:
    mark = event.start_mark
    where = f"{source}:{mark.line + 1}:{mark.column + 1}" if mark else source
    raise ConfigError(source, [f"{where}: {what}"])


def parse_yaml(text: str, source: str) -> tuple[dict[str, Any], yaml.Node]:
    loader = None
    try:
        check_shape(text, source)
        loader = _Loader(text)
        root = loader.get_single_node()
        data = loader.construct_document(root) if root is not None else None
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f"{source}:{mark.line + 1}:{mark.column + 1}" if mark else source
        raise ConfigError(source, [f"{where}: invalid YAML: {exc.problem or exc.context}"]) from None
    except yaml.YAMLError as exc:
        raise ConfigError(source, [f"{source}: invalid YAML: {exc}"]) from None
    finally:
        if loader is not None:
            loader.dispose()
    if root is None:
        raise ConfigError(source, [f"{source}: the file is empty; {EXAMPLE_HINT}"])
    if not isinstance(data, dict):
        where = f"{source}:{root.start_mark.line + 1}:{root.start_mark.column + 1}"
        sections = "receivers, processors, exporters, targets and service"
        raise ConfigError(source, [f"{where}: the top level must be a mapping with {sections}"])
    return data, root


def node_at(root: yaml.Node, path: OptionPath) -> yaml.Node:
    """The deepest YAML node along ``path`` (a mapping entry's key node, a sequence's item)."""
    node, found = root, root
    for part in path:
        if isinstance(node, yaml.MappingNode):
            keys = (entry for entry in node.value if isinstance(entry[0], yaml.ScalarNode))
            entry = next((e for e in keys if e[0].value == str(part)), None)
            if entry is None:
                break
            found, node = entry
        elif isinstance(node, yaml.SequenceNode) and isinstance(part, int) and 0 <= part < len(node.value):
            found = node = node.value[part]
        else:
            break
    return found
