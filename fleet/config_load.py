"""Load fleet.yaml into a frozen `Config`, with errors that name file, field and line.

PyYAML's composer keeps the position of every node; we keep a map from the path
of each value (('sites', 3, 'start_url')) to its line, so a pydantic error
location becomes `fleet.yaml:14: sites[3].start_url: ...`. Duplicate keys, which
PyYAML would silently merge, are errors too.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from fleet.config import Config, DuplicateSiteError
from fleet.errors import ConfigError

Loc = tuple[str | int, ...]


@dataclass(frozen=True)
class Problem:
    file: str
    line: int | None
    field: str
    message: str

    def __str__(self) -> str:
        where = f"{self.file}:{self.line}" if self.line else self.file
        return f"{where}: {self.field}: {self.message}" if self.field else f"{where}: {self.message}"


def field_name(loc: Loc) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


class _Composer:
    """Turn a composed YAML node tree into Python values plus a path -> line map."""

    def __init__(self, file: str):
        self.file = file
        self.lines: dict[Loc, int] = {}
        self.problems: list[Problem] = []
        self._constructor = yaml.SafeLoader("")

    def value(self, node: yaml.Node, path: Loc) -> Any:
        self.lines.setdefault(path, node.start_mark.line + 1)
        if isinstance(node, yaml.MappingNode):
            out: dict[Any, Any] = {}
            for key_node, value_node in node.value:
                key = self._constructor.construct_object(key_node, deep=True)
                if not isinstance(key, (str, int)):
                    self.problems.append(
                        Problem(self.file, key_node.start_mark.line + 1, field_name(path), f"key {key!r} is not a string")
                    )
                    continue
                if key in out:
                    self.problems.append(
                        Problem(self.file, key_node.start_mark.line + 1, field_name(path + (key,)), "duplicate key")
                    )
                    continue
                self.lines[path + (key,)] = key_node.start_mark.line + 1
                out[key] = self.value(value_node, path + (key,))
            return out
        if isinstance(node, yaml.SequenceNode):
            return [self.value(item, path + (i,)) for i, item in enumerate(node.value)]
        return self._constructor.construct_object(node, deep=True)

    def line_of(self, loc: Loc) -> int | None:
        for end in range(len(loc), -1, -1):
            if loc[:end] in self.lines:
                return self.lines[loc[:end]]
        return None


def _allowed_keys(loc: Loc) -> list[str] | None:
    """Field names of the model that owns the unknown key at `loc`."""
    model: Any = Config
    for part in loc[:-1]:
        if isinstance(part, int):
            continue
        if not (isinstance(model, type) and issubclass(model, BaseModel)) or part not in model.model_fields:
            return None
        annotation = model.model_fields[part].annotation
        inner = getattr(annotation, "__args__", None)
        model = inner[0] if inner else annotation
    if isinstance(model, type) and issubclass(model, BaseModel):
        return list(model.model_fields)
    return None


def _message(err: dict[str, Any]) -> tuple[Loc, str]:
    loc: Loc = tuple(err["loc"])
    kind = err["type"]
    cause = (err.get("ctx") or {}).get("error")
    if isinstance(cause, DuplicateSiteError):
        return ("sites", cause.index, "id"), str(cause)
    if kind == "extra_forbidden":
        allowed = _allowed_keys(loc)
        hint = f" (allowed: {', '.join(allowed)})" if allowed else ""
        return loc, f"unknown key {loc[-1]!r}{hint}"
    if kind == "missing":
        return loc, "required key is missing"
    msg = err["msg"]
    if msg.startswith("Value error, "):
        msg = msg[len("Value error, "):]
    if kind == "too_short" and loc == ("sites",):
        msg = "at least one site is required"
    return loc, msg


def parse_config(text: str, file: str = "<config>") -> Config:
    """Validate YAML text as a Config; raise ConfigError naming file, line and field."""
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        line = mark.line + 1 if mark else None
        raise ConfigError([Problem(file, line, "", f"malformed YAML: {e.problem or e}")]) from None
    except yaml.YAMLError as e:
        raise ConfigError([Problem(file, None, "", f"malformed YAML: {e}")]) from None
    if root is None:
        raise ConfigError([Problem(file, None, "", "the file is empty; it needs at least a 'sites' list")])
    composer = _Composer(file)
    data = composer.value(root, ())
    if composer.problems:
        raise ConfigError(composer.problems)
    if not isinstance(data, dict):
        raise ConfigError([Problem(file, 1, "", "the top level must be a mapping with run, fleet, aws and sites")])
    try:
        return Config.model_validate(data)
    except ValidationError as e:
        problems = []
        for err in e.errors(include_url=False):
            if err["type"] == "too_short" and err["loc"] == ("sites",) and data.get("sites"):
                continue  # pydantic counts only the valid sites; the invalid ones have errors of their own
            loc, msg = _message(err)
            problems.append(Problem(file, composer.line_of(loc), field_name(loc), msg))
        raise ConfigError(problems) from None


def load_config(path: str | Path) -> Config:
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError([Problem(str(p), None, "", "no such file")]) from None
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError([Problem(str(p), None, "", f"cannot read: {e}")]) from None
    return parse_config(text, str(p))


def dump_config(config: Config) -> str:
    """YAML text that `parse_config` reads back as the same Config."""
    data = config.model_dump(mode="json", exclude_none=True)
    return yaml.safe_dump(data, sort_keys=False)
