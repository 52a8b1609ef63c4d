"""fleet-yaml.md: every key of fleet.yaml, from the pydantic models `fleet.config.load.load_config` validates a file
into (`fleet.config.Config` and the sections under it), and the options of the built-in crawlers
(`fleet.crawl.crawlers.BUILTIN_OPTIONS`), which a site's `options` are checked against."""

from __future__ import annotations

import json
import types
import typing
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Literal

import annotated_types
from pydantic import BaseModel, SecretStr
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from fleet.config import Config
from fleet.crawl.crawlers import BUILTIN_OPTIONS
from reference_pages.markdown import Page, code, first_paragraph, link, one_line, text

_NAMES: dict[Any, str] = {int: "integer", float: "number", str: "string", bool: "boolean", SecretStr: "string (secret)"}


@dataclass
class Section:
    """One model of the config: where its keys sit in fleet.yaml (`path`), its heading (`title`), what it is
    (`about`), and the sections under it, those its fields hold by field name."""

    path: str
    title: str
    model: type[BaseModel]
    about: list[str]
    children: list[Section] = field(default_factory=list)
    of_field: dict[str, Section] = field(default_factory=dict)


def unwrap(annotation: Any) -> tuple[Any, list[Any]]:
    """(the type under `Annotated[...]`, the metadata of every `Annotated` layer)."""
    meta: list[Any] = []
    while typing.get_origin(annotation) is typing.Annotated:
        annotation, *more = typing.get_args(annotation)
        meta += more
    return annotation, meta


def _union(annotation: Any) -> list[Any] | None:
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return list(typing.get_args(annotation))
    return None


def model_of(annotation: Any) -> tuple[type[BaseModel], str] | None:
    """(the section model, how its path goes on: "", "[]" or ".<key>") when a field holds a section, a list of
    them or a mapping of them."""
    annotation, _ = unwrap(annotation)
    for arm in _union(annotation) or [annotation]:
        arm, _ = unwrap(arm)
        args = [unwrap(a)[0] for a in typing.get_args(arm)]
        if isinstance(arm, type) and issubclass(arm, BaseModel):
            return arm, ""
        if typing.get_origin(arm) is tuple and args and isinstance(args[0], type) and issubclass(args[0], BaseModel):
            return args[0], "[]"
        if typing.get_origin(arm) is dict and isinstance(args[1], type) and issubclass(args[1], BaseModel):
            return args[1], ".<key>"
    return None


def type_name(annotation: Any) -> str:
    """The YAML type a field takes, in words."""
    annotation, _ = unwrap(annotation)
    arms = _union(annotation)
    if arms is not None:
        named = [type_name(a) for a in arms if a is not type(None)]
        return " or ".join(named) + (" or null" if type(None) in arms else "")
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is Literal:
        return "one of " + ", ".join(f"`{a}`" for a in args)
    if origin is tuple:
        return f"list of {type_name(args[0])}"
    if origin is dict:
        return f"mapping of {type_name(args[0])} to {type_name(args[1])}"
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return "section"
    if annotation is Any:
        return "any"
    return _NAMES.get(annotation, getattr(annotation, "__name__", str(annotation)))


def _count(n: int, annotation: Any) -> str:
    """A length as it counts: a string's characters, a list's or a mapping's entries."""
    inner, _ = unwrap(annotation)
    arms = [unwrap(a)[0] for a in _union(inner) or [inner] if a is not type(None)]
    unit = ("character", "characters") if all(typing.get_origin(a) is None for a in arms) else ("entry", "entries")
    return f"{n} {unit[n != 1]}"


def _constraints(annotation: Any, info: FieldInfo) -> list[str]:
    """The bounds a value must keep: those of the field and those of the types it is made of."""
    meta = list(info.metadata)
    stack = [annotation]
    while stack:
        a = stack.pop()
        inner, more = unwrap(a)
        meta += more
        stack += [x for x in typing.get_args(inner) if typing.get_origin(inner) in (typing.Union, types.UnionType)]
    meta += [inner for m in meta if isinstance(m, FieldInfo) for inner in m.metadata]  # Field() inside Annotated
    out: list[str] = []
    for m in meta:
        for kind, attr, sign in (("Ge", "ge", ">="), ("Gt", "gt", ">"), ("Le", "le", "<="), ("Lt", "lt", "<")):
            if isinstance(m, getattr(annotated_types, kind)):
                out.append(f"{sign} {getattr(m, attr)}")
        if isinstance(m, annotated_types.MinLen):
            out.append(f"at least {_count(m.min_length, annotation)}")
        if isinstance(m, annotated_types.MaxLen):
            out.append(f"at most {_count(m.max_length, annotation)}")
        if getattr(m, "pattern", None):
            out.append(f"matching `{m.pattern}`")
    return list(dict.fromkeys(out))


def default_text(info: FieldInfo) -> str:
    """The default as YAML would write it; "required" when there is none; "" for a section (its keys say)."""
    if info.default is PydanticUndefined and info.default_factory is None:
        return "required"
    value = info.get_default(call_default_factory=True, validated_data={})
    if isinstance(value, BaseModel):
        return ""
    if isinstance(value, str):
        return code(value, cell=True) if value else code('""', cell=True)
    return code(json.dumps(value, default=str), cell=True)


def describe(info: FieldInfo, model: type[BaseModel] | None = None) -> str:
    """A field's description; for a section without one, its model's docstring."""
    return one_line(info.description or "") or (first_paragraph(model.__doc__) if model else "")


def section(path: str, model: type[BaseModel], about: list[str], suffix: str = "") -> Section:
    s = Section(path, path + suffix, model, list(dict.fromkeys(a for a in about if a)))
    for name, info in model.model_fields.items():
        sub = model_of(info.annotation)
        if sub is not None:
            child_model, tail = sub
            docs = [one_line(info.description or ""), first_paragraph(child_model.__doc__)]
            child = section(f"{path}.{name}{tail}".lstrip("."), child_model, docs, suffix)
            s.children.append(child)
            s.of_field[name] = child
    return s


def tree() -> Section:
    """The config's sections, the root first; the built-in crawlers' options under `sites[]`."""
    root = section("", Config, [first_paragraph(Config.__doc__)])
    sites = root.of_field["sites"]
    for crawler, options in BUILTIN_OPTIONS.items():
        about = [f"The `options` of a site whose `crawler` is `{crawler}`.", first_paragraph(options.__doc__)]
        sites.children.append(section("sites[].options", options, about, f" ({crawler})"))
    return root


def walk(s: Section, depth: int = 0) -> Iterator[tuple[Section, int]]:
    yield s, depth
    for c in s.children:
        yield from walk(c, depth + 1)


def rows(s: Section) -> Iterator[list[str]]:
    for name, info in s.model.model_fields.items():
        child = s.of_field.get(name)
        kind = text(type_name(info.annotation), cell=True)
        path = f"{s.path}.{name}" if s.path else name
        if child is not None:
            kind += ": " + link(code(child.title, cell=True), child.title)
        elif others := [c for c in s.children if c.path == path]:  # a built-in crawler's `options`
            kind += ": " + ", ".join(link(code(c.title, cell=True), c.title) for c in others)
        bounds = text(", ".join(_constraints(info.annotation, info)), cell=True)
        desc = describe(info, child.model if child else None)
        yield [
            code(path, cell=True),
            ", ".join(x for x in (kind, bounds) if x),
            default_text(info),
            text(desc, cell=True),
        ]


def render() -> str:
    root = tree()
    page = Page("fleet.yaml", "the models of `fleet.config` (`Config`, which `load_config` validates into)")
    page.para(
        text(first_paragraph(Config.__doc__))
        + " Every key, its type and bounds, its default and what it does. A section is a mapping of its own keys; "
        "`[]` marks a list's items and `<key>` a mapping's keys of your choosing."
    )
    forbid = [m.path or "the top level" for m, _ in walk(root) if m.model.model_config.get("extra") != "forbid"]
    page.para(
        "A key no section defines is refused at load, with the keys it allows."
        if not forbid
        else "Unknown keys are refused everywhere but in " + ", ".join(code(p) for p in forbid) + "."
    )
    for s, depth in walk(root):
        if depth == 0:
            page.heading(2, "Top level")
        else:
            page.heading(2 if depth == 1 else 3, s.title, as_code=True)
        for about in s.about if depth else []:
            page.para(text(about))
        page.table(["Key", "Type", "Default", "Description"], rows(s))
    return page.render()
