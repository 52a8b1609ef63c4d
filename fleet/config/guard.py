"""Reading untrusted YAML into plain values, bounded, with the line of every value kept for messages.

Every command loads the config, and so does every node at boot, so reading is bounded whatever the file holds:
its size, its nesting and the number of values its aliases expand to are capped before anything is built (an
alias bomb of a few hundred bytes otherwise expands to billions of values), a recursive alias is an error, and
only plain YAML values are built (no tags that construct objects). Keys YAML 1.1 reads as booleans or null
(`on:`, `no:`, `~:`) are errors naming the key as written, rather than a message about key types. Duplicate keys,
which PyYAML would silently merge, are errors too.

PyYAML's composer keeps the position of every node; the composer here keeps a map from the path of each value
(('sites', 3, 'start_url')) to its line, so that a validation error's location can name its line.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import yaml

from fleet.errors import QUOTE_KEEP, ConfigError, quote

Loc = tuple[str | int, ...]

#: A config larger than this is refused before it is parsed.
MAX_FILE_BYTES = 5 * 1024 * 1024
#: Values in the document once aliases are expanded (a 5 MB config of sites holds about 600,000).
MAX_VALUES = 1_000_000
#: Mappings and lists nested in one another, aliases expanded.
MAX_DEPTH = 64
#: Digits of an integer: DynamoDB's number precision, since sites' options are stored on their records.
MAX_INT_DIGITS = 38
#: A key in a field's name, or a scalar in a message about how YAML reads it, keeps this much of itself
#: (`fleet.errors.quote`).
_KEEP = 24

_Y = "tag:yaml.org,2002:"
STR, INT, FLOAT, BOOL, NULL = _Y + "str", _Y + "int", _Y + "float", _Y + "bool", _Y + "null"
TIMESTAMP, MERGE, VALUE, SEQ, MAP = _Y + "timestamp", _Y + "merge", _Y + "value", _Y + "seq", _Y + "map"
#: Scalars YAML 1.1 reads as something other than a string, as a key would be read.
_KEY_KINDS = {BOOL: "a boolean", NULL: "null", INT: "an integer", FLOAT: "a number", TIMESTAMP: "a date"}
_SHORT_BOOLS = {"y": True, "Y": True, "n": False, "N": False}


@dataclass(frozen=True)
class Problem:
    file: str
    line: int | None
    field: str
    message: str

    def __str__(self) -> str:
        where = f"{self.file}:{self.line}" if self.line else self.file
        text = f"{where}: {self.field}: {self.message}" if self.field else f"{where}: {self.message}"
        return text.replace("\r", "\\r").replace("\n", "\\n")  # one problem, one line


class Refused(Exception):
    """A bound was crossed: loading stops at once with this one problem."""

    def __init__(self, problem: Problem):
        super().__init__(str(problem))
        self.problem = problem


def field_name(loc: Loc) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif len(part) > QUOTE_KEEP:  # a long key is cut short: its message may quote it too
            out += f"[{quote(part, _KEEP)}]"
        elif not part.isprintable() or not part or any(c in part for c in ".[]"):
            out += f"[{part!r}]"
        else:
            out += f".{part}" if out else part
    return out


def _line(node: yaml.Node) -> int:
    return node.start_mark.line + 1


def _tag_name(tag: str) -> str:
    return "!!" + tag[len(_Y) :] if tag.startswith(_Y) else tag


class Loader(yaml.SafeLoader):
    """PyYAML's composer, refusing nesting deeper than MAX_DEPTH as it reads (it composes recursively, so a
    deep document would end in a RecursionError), and keeping for messages each anchor's name and the line
    of each alias in a list (an alias becomes the anchored node itself, which has only the anchor's line)."""

    def __init__(self, text: str, file: str):
        super().__init__(text)
        self.file = file
        self.depth = 0
        self.anchors_by_node: dict[int, str] = {}
        self.alias_lines: dict[tuple[int, int], int] = {}  # (id(list node), index) -> line

    def compose_node(self, parent: yaml.Node | None, index: Any) -> yaml.Node | None:
        event = self.peek_event()
        line = event.start_mark.line + 1 if event.start_mark else None
        if isinstance(event, yaml.AliasEvent):
            if isinstance(parent, yaml.SequenceNode) and isinstance(index, int) and line is not None:
                self.alias_lines[(id(parent), index)] = line
            return super().compose_node(parent, index)
        nests = isinstance(event, (yaml.SequenceStartEvent, yaml.MappingStartEvent))
        if nests:
            if self.depth >= MAX_DEPTH:
                raise Refused(Problem(self.file, line, "", f"nested deeper than {MAX_DEPTH} levels"))
            self.depth += 1
        try:
            node = super().compose_node(parent, index)
        finally:
            if nests:
                self.depth -= 1
        if event.anchor:
            self.anchors_by_node[id(node)] = event.anchor
        return node


class Composer:
    """Turn a composed YAML node tree into Python values plus a path -> line map.

    `measure` runs first: it sizes the tree as aliases expand it, counting each node once (so an alias bomb
    costs as much as its text), and refuses it before `value` builds anything.
    """

    def __init__(self, file: str, loader: Loader | None = None):
        self.file = file
        self.lines: dict[Loc, int] = {}
        self.problems: list[Problem] = []
        self._anchors = loader.anchors_by_node if loader else {}
        self._alias_lines = loader.alias_lines if loader else {}
        self._constructor = yaml.SafeLoader("")
        self._sizes: dict[int, tuple[int, int]] = {}  # id(node) -> (values once expanded, levels of nesting)
        self._open: set[int] = set()  # nodes being measured: meeting one again is a recursive alias

    def _refuse(self, path: Loc, line: int, message: str) -> Refused:
        return Refused(Problem(self.file, line, field_name(path), message))

    # --- bounds --------------------------------------------------------------------------
    def measure(self, node: yaml.Node, path: Loc = (), where: int | None = None, depth: int = 0) -> int:
        """Values under `node` with aliases expanded; raise Refused past MAX_VALUES or MAX_DEPTH, or on a
        recursive alias. `where` is the line that refers to it (its key's, or its alias's), `depth` the number
        of collections around it."""
        where = where or _line(node)
        key = id(node)
        if key in self._open:
            anchor = self._anchors.get(key)
            name = f" *{anchor}" if anchor else ""
            raise self._refuse(path, where, f"recursive alias{name}: the value contains itself")
        if key in self._sizes:
            size, height = self._sizes[key]
            if depth + height > MAX_DEPTH:
                raise self._refuse(path, where, f"nested deeper than {MAX_DEPTH} levels once aliases are expanded")
            return size
        if isinstance(node, yaml.ScalarNode):
            self._sizes[key] = (1, 0)
            return 1
        if depth >= MAX_DEPTH:
            raise self._refuse(path, where, f"nested deeper than {MAX_DEPTH} levels once aliases are expanded")
        self._open.add(key)
        size, height = 1, 1
        children: list[tuple[yaml.Node, Loc, int | None]]
        if isinstance(node, yaml.MappingNode):
            children = []
            for k, v in node.value:
                sub = path + (k.value,) if isinstance(k, yaml.ScalarNode) else path
                children += [(k, path, None), (v, sub, _line(k))]
        else:
            children = [(item, path + (i,), self._alias_lines.get((key, i))) for i, item in enumerate(node.value)]
        for child, sub, child_where in children:
            size += self.measure(child, sub, child_where, depth + 1)
            height = max(height, 1 + self._sizes[id(child)][1])
            if size > MAX_VALUES:
                raise self._refuse(path, _line(node), f"more than {MAX_VALUES:,} values once aliases are expanded")
        self._open.discard(key)
        self._sizes[key] = (size, height)
        return size

    # --- values ---------------------------------------------------------------------------
    def value(self, node: yaml.Node, path: Loc) -> Any:
        self.lines.setdefault(path, _line(node))
        if isinstance(node, yaml.MappingNode):
            if node.tag != MAP:
                return self._bad_tag(node, path)
            out: dict[str, Any] = {}
            for key, key_node, value_node in self._pairs(node, path):
                self.lines[path + (key,)] = _line(key_node)
                out[key] = self.value(value_node, path + (key,))
            return out
        if isinstance(node, yaml.SequenceNode):
            if node.tag != SEQ:
                return self._bad_tag(node, path)
            return [self.value(item, path + (i,)) for i, item in enumerate(node.value)]
        if not isinstance(node, yaml.ScalarNode):  # no other kind of node is composed
            return self._bad_tag(node, path)
        return self._scalar(node, path)

    def _pairs(self, node: yaml.MappingNode, path: Loc) -> list[tuple[str, yaml.Node, yaml.Node]]:
        """The mapping's (key, key node, value node), with `<<` merged as YAML 1.1 says: the mapping's own
        keys win, then the merged mappings in their order."""
        own: dict[str, tuple[yaml.Node, yaml.Node]] = {}
        merged: list[tuple[str, yaml.Node, yaml.Node]] = []
        for key_node, value_node in node.value:
            if isinstance(key_node, yaml.ScalarNode) and key_node.tag == MERGE:
                sources = value_node.value if isinstance(value_node, yaml.SequenceNode) else [value_node]
                for source in sources:
                    if isinstance(source, yaml.MappingNode) and source.tag == MAP:
                        merged += self._pairs(source, path)
                    else:
                        self.problems.append(
                            Problem(
                                self.file,
                                _line(key_node),
                                field_name(path),
                                "'<<' (merge) takes a mapping or a list of mappings",
                            )
                        )
                continue
            key = self._key(key_node, path)
            if key is None:
                continue
            if key in own:
                self.problems.append(Problem(self.file, _line(key_node), field_name(path + (key,)), "duplicate key"))
                continue
            own[key] = (key_node, value_node)
        out = [(k, kn, vn) for k, (kn, vn) in own.items()]
        for k, kn, vn in merged:
            if k not in own:
                own[k] = (kn, vn)
                out.append((k, kn, vn))
        return out

    def _key(self, node: yaml.Node, path: Loc) -> str | None:
        if isinstance(node, yaml.ScalarNode):
            text = node.value
            # PyYAML reads a plain y or n as a string, YAML 1.1 (and other tools) as a boolean
            tag = BOOL if node.tag == STR and node.style is None and text in _SHORT_BOOLS else node.tag
            if tag in (STR, VALUE):
                return str(text)
            kind = _KEY_KINDS.get(tag)
            if kind is None:
                self._bad_tag(node, path)
                return None
            truth = _SHORT_BOOLS.get(text, yaml.SafeLoader.bool_values.get(text.lower()))
            shown = f"{kind} ({str(truth).lower()})" if tag == BOOL and truth is not None else kind
            message = (
                f"key {quote(text, _KEEP)} is read as {shown} by YAML: quote it ({_quoted(text)}) "
                "if it is meant as a name"
            )
        else:
            kind = "a mapping" if isinstance(node, yaml.MappingNode) else "a list"
            message = f"a key is {kind}: keys must be names"
        self.problems.append(Problem(self.file, _line(node), field_name(path), message))
        return None

    def _scalar(self, node: yaml.ScalarNode, path: Loc) -> Any:
        text = node.value
        if node.tag in (STR, VALUE, MERGE, TIMESTAMP):
            # `=` and `<<` as values are plain text, and so is a date: no field is one, and a site's options
            # are stored on its record, where a date object cannot go
            return str(text)
        if node.tag not in (INT, FLOAT, BOOL, NULL):
            return self._bad_tag(node, path)
        if node.tag == INT and len(text) > MAX_INT_DIGITS + 8:  # room for a sign, 0x and underscores
            return self._problem(
                node, path, f"integer {quote(text, _KEEP, bare=True)} is too long (at most {MAX_INT_DIGITS} digits)"
            )
        try:
            value = self._constructor.construct_object(node)
        except (ValueError, OverflowError, KeyError, IndexError, yaml.YAMLError):  # e.g. `!!bool maybe`
            return self._problem(node, path, f"{quote(text, _KEEP)} cannot be read as {_KEY_KINDS[node.tag]}")
        if node.tag == INT and abs(value) >= 10**MAX_INT_DIGITS:
            return self._problem(
                node, path, f"integer {quote(text, _KEEP, bare=True)} is too long (at most {MAX_INT_DIGITS} digits)"
            )
        if node.tag == FLOAT and not math.isfinite(value):
            return self._problem(node, path, f"{quote(text, _KEEP, bare=True)} is not a finite number")
        return value

    def _bad_tag(self, node: yaml.Node, path: Loc) -> None:
        return self._problem(
            node,
            path,
            f"tag {_tag_name(node.tag)!r} is not supported: only plain values "
            "(strings, numbers, booleans, null, lists and mappings)",
        )

    def _problem(self, node: yaml.Node, path: Loc, message: str) -> None:
        self.problems.append(Problem(self.file, _line(node), field_name(path), message))
        return None

    def line_of(self, loc: Loc) -> int | None:
        for end in range(len(loc), -1, -1):
            if loc[:end] in self.lines:
                return self.lines[loc[:end]]
        return None


def _quoted(text: str) -> str:
    """The key as it would be written in double quotes (a long one: its first characters, and the quote closed)."""
    if len(text) > _KEEP:
        text = text[:_KEEP] + "…"
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def one_line(text: str) -> str:
    return " ".join(text.split())


def compose(text: str, file: str) -> tuple[Loader, yaml.Node | None]:
    """The document's node tree (None if it is empty); ConfigError if it is not YAML or nests too deep."""
    loader: Loader | None = None
    try:
        loader = Loader(text, file)  # the reader checks the characters here already
        return loader, loader.get_single_node()
    except Refused as e:
        raise ConfigError([e.problem]) from None
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        line = mark.line + 1 if mark else None
        raise ConfigError([Problem(file, line, "", f"malformed YAML: {one_line(e.problem or str(e))}")]) from None
    except yaml.reader.ReaderError as e:
        line = text.count("\n", 0, e.position) + 1
        raise ConfigError(
            [Problem(file, line, "", f"malformed YAML: unacceptable character #x{e.character:04x}: {e.reason}")]
        ) from None
    except yaml.YAMLError as e:
        raise ConfigError([Problem(file, None, "", f"malformed YAML: {one_line(str(e))}")]) from None
    finally:
        if loader is not None:
            loader.dispose()
