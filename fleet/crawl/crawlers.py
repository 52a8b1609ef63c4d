"""Names of crawlers and the options of the built-in ones, shared by the config validator and the nodes.

`fleet` may not import `node`, so built-in crawlers are named by dotted path and
resolved only where they run. A site's `crawler` is a built-in name or a dotted
path `package.module:Class` (or `package.module.Class`) importable on the nodes.

A built-in crawler's options are a model here: the config checks a site's
options against it when it loads, and the crawler reads them through it, so a
bad option stops `validate` instead of failing every attempt, and the defaults
live in one place. The `links` crawler's CSS selectors are parsed there too
(`fleet.crawl.css`), each bad one its own error. Crawlers named by dotted path take
free-form options.

A dotted path is checked without importing anything: importing runs code (a
package's `__init__` prints, connects, reads the environment) in every command
that loads a config. The module's file is located package by package, and its
source is parsed to see that it defines the class.
"""

from __future__ import annotations

import ast
import importlib.machinery
import importlib.util
import os
import re
import string
import sys
from collections.abc import Mapping
from typing import Annotated, Any, Self

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    StrictInt,
    StrictStr,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_core import ErrorDetails

from fleet.crawl.css import selector_problem
from fleet.errors import quote

BUILTIN_CRAWLERS: dict[str, str] = {
    "links": "node.crawlers.links:LinksCrawler",
    "api": "node.crawlers.api:ApiCrawler",
}

_DOTTED = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*([:.][A-Za-z_]\w*)")

#: A crawler module's source larger than this is accepted as found without being parsed.
_MAX_SOURCE_BYTES = 2 * 1024 * 1024


def _not_blank(v: str) -> str:
    if not v.strip():
        raise ValueError("must not be empty")
    return v


#: A JSON key (or a name): a string with something in it.
Name = Annotated[StrictStr, AfterValidator(_not_blank)]


def _selector(v: str) -> str:
    problem = selector_problem(v)
    if problem:
        raise ValueError(f"not a CSS selector: {quote(v)}: {problem}")
    return v


#: A CSS selector, parsed when the config loads (`fleet.crawl.css`): one Chromium would refuse stops `validate`.
Selector = Annotated[StrictStr, AfterValidator(_not_blank), AfterValidator(_selector)]


class OptionsError(ValueError):
    """A built-in crawler's options do not fit its model. `errors` are pydantic's, located within the options."""

    def __init__(self, model: type[CrawlerOptions], errors: list[ErrorDetails]):
        self.model = model
        self.errors = errors
        super().__init__(
            "options: "
            + "; ".join(
                f"{'.'.join(map(str, e['loc']))}: {error_text(e)}" if e["loc"] else error_text(e) for e in errors
            )
        )


def error_text(error: ErrorDetails) -> str:
    """pydantic's message for one error, without the "Value error, " its own validators' messages get."""
    return error["msg"].removeprefix("Value error, ")


class CrawlerOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    @classmethod
    def read(cls, options: Mapping[str, Any]) -> Self:
        """The options as this model, or OptionsError naming each bad one."""
        try:
            return cls.model_validate(dict(options))
        except ValidationError as e:
            raise OptionsError(cls, e.errors(include_url=False)) from None


#: `links` fields: at most this many per item (and per detail page), each selector at most this long.
MAX_FIELDS = 50
MAX_SELECTOR_CHARS = 500
_FIELD_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}")
_ATTRIBUTE = re.compile(r"[A-Za-z_:][-A-Za-z0-9_:.]*")
#: What an item with fields always has; a field may not take its name.
RESERVED_FIELDS = frozenset({"id"})


def _field_name(v: str) -> str:
    if not _FIELD_NAME.fullmatch(v):
        raise ValueError(f"field name {quote(v)} is not an identifier (letters, digits, _; at most 64)")
    if v in RESERVED_FIELDS:
        raise ValueError(f"field name {quote(v)} is reserved")
    return v


def split_field(spec: str) -> tuple[str, str | None]:
    """A field's selector as written ("h2", "time@datetime", "@href") -> (CSS selector, attribute or None for
    the text). An empty selector is the item element itself. An "@" inside the selector (an attribute value in
    quotes) is not the attribute suffix: only a last "@" followed by an attribute name is."""
    selector, at, attribute = spec.rpartition("@")
    if not at or not _ATTRIBUTE.fullmatch(attribute):
        return spec.strip(), None
    return selector.strip(), attribute


def _field_spec(v: str) -> str:
    if len(v) > MAX_SELECTOR_CHARS:
        raise ValueError(f"selector longer than {MAX_SELECTOR_CHARS} characters")
    selector, attribute = split_field(v)
    if not selector and attribute is None:
        raise ValueError("must be a CSS selector, optionally with @attribute")
    problem = selector_problem(selector) if selector else None
    if problem:
        of = "" if attribute is None else f" (before @{attribute})"
        raise ValueError(f"not a CSS selector: {quote(selector)}{of}: {problem}")
    return v


def _field_names(v: dict[str, str]) -> dict[str, str]:
    for name in v:
        _field_name(name)  # said of the mapping: pydantic would locate a bad key as "fields.<key>.[key]"
    return v


FieldName = Annotated[StrictStr, AfterValidator(_field_name)]
FieldSpec = Annotated[StrictStr, AfterValidator(_field_spec)]
Fields = Annotated[dict[StrictStr, FieldSpec], Field(max_length=MAX_FIELDS), AfterValidator(_field_names)]


#: What an item without `fields` holds besides its id, so what a `links` `id` may name.
PLAIN_FIELDS = ("text", "href")
#: `links` `id` as written is at most this long.
MAX_ID_TEMPLATE_CHARS = 500


def id_template(spec: str) -> list[tuple[str, str]]:
    """A `links` `id` as written -> [(literal text, field name)...]; a last piece of text alone has the name "".

    A field name alone ("link") is that field; anything else is a template of `{field}`s ("{link}#{name}"), `{{`
    and `}}` standing for braces. ValueError when it is neither, names no field, or a placeholder is not a plain
    field name (no conversion, format, index or attribute)."""
    if _FIELD_NAME.fullmatch(spec):
        return [("", spec)]
    try:
        pieces = list(string.Formatter().parse(spec))
    except ValueError as e:
        raise ValueError(f"{quote(spec)} is not a field name or a template of {{field}}s: {e}") from None
    out: list[tuple[str, str]] = []
    for text, name, fmt, conversion in pieces:
        if name is None:
            out.append((text, ""))
            continue
        if fmt or conversion or not _FIELD_NAME.fullmatch(name):
            raise ValueError(f"{quote(spec)}: {{{name}}} is not a plain {{field}} (a field name, nothing more)")
        out.append((text, name))
    if not any(name for _, name in out):
        raise ValueError(f"{quote(spec)} names no field: every item would have the same id")
    return out


def item_fields(fields: Mapping[str, str]) -> tuple[str, ...]:
    """The fields an item of `links` has on its listing page: those of `fields`, else text and href."""
    return tuple(fields) if fields else PLAIN_FIELDS


def render_id(template: list[tuple[str, str]], values: Mapping[str, Any]) -> str:
    """An item's id from its fields by `id_template`'s pieces: a null field reads as nothing, and an id whose
    every field is null or empty is "" (the item has no id)."""
    read = {name: "" if values.get(name) is None else str(values.get(name)) for _, name in template if name}
    if not any(read.values()):
        return ""
    return "".join(text + read.get(name, "") for text, name in template)


class DetailOptions(BaseModel):
    """`links` `detail`: open each new item's link and read more fields there."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    link: FieldName | None = Field(
        None, description="the field holding the item's URL; null: the item element's own (absolute) href"
    )
    fields: Fields = Field(description="name -> CSS selector[@attribute] on the detail page")
    max_pages: StrictInt | None = Field(None, ge=1, description="open at most this many detail pages in all")

    @model_validator(mode="before")
    @classmethod
    def _known_keys(cls, data: Any) -> Any:
        # said here rather than by extra="forbid", whose message would list the keys of the enclosing options
        unknown = sorted(set(data) - set(cls.model_fields)) if isinstance(data, Mapping) else []
        if unknown:
            raise ValueError(f"unknown key {quote(unknown[0])} (allowed: {', '.join(cls.model_fields)})")
        return data


class LinksOptions(CrawlerOptions):
    """`links`: items by CSS selector, pages by a "next" link; optionally fields per item and a detail page each."""

    item: Selector = Field("a.item", description="CSS selector of the items on a page")
    next: Selector | None = Field(
        "a.next", description="CSS selector of the link to the next page; null: one page only"
    )
    max_pages: StrictInt = Field(10, ge=1, description="stop after this many listing pages")
    fields: Fields = Field(
        default_factory=dict, description="name -> CSS selector[@attribute] within the item; none: id, text, href"
    )
    detail: DetailOptions | None = Field(None, description="open each new item's link and read fields there")
    id: Annotated[StrictStr, Field(max_length=MAX_ID_TEMPLATE_CHARS)] | None = Field(
        None,
        description="an item's id: a field name, or a template of fields such as '{link}#{name}'; "
        "null: its data-id, else its link",
    )

    @property
    def item_fields(self) -> tuple[str, ...]:
        """The fields an item has on its listing page (what `id` may name)."""
        return item_fields(self.fields)

    @field_validator("id")
    @classmethod
    def _id_fits(cls, v: str | None, info: ValidationInfo) -> str | None:
        """Said of `id` (declared after `fields` and `detail`, so both are read by now): every field it names is
        one the item has on its listing page."""
        if v is None:
            return v
        names = [name for _, name in id_template(v) if name]
        if "fields" not in info.data:  # `fields` itself is wrong: said there
            return v
        known = item_fields(info.data["fields"])
        detail = info.data.get("detail")
        for name in names:
            if name not in known:
                late = detail is not None and name in detail.fields
                where = "a detail field (ids are read on the listing page)" if late else "not a field of the item"
                raise ValueError(f"{quote(name)} in {quote(v)} is {where}; the item's fields: {', '.join(known)}")
        return v

    @model_validator(mode="after")
    def _detail_fits(self) -> Self:
        if self.detail is None:
            return self
        if self.detail.link is not None and self.detail.link not in self.fields:
            raise ValueError(f"detail.link: {quote(self.detail.link)} is not one of the item's fields")
        clash = sorted(set(self.detail.fields) & set(self.fields))
        if clash:
            raise ValueError(f"detail.fields.{clash[0]}: already an item field")
        return self


class ApiOptions(CrawlerOptions):
    """`api`: a paginated JSON API, by token."""

    items: Name = Field("items", description="key of the list of items in each response")
    next: Name = Field("next", description="key of the next page's token; null or missing ends the crawl")
    token_param: Name = Field("token", description="query parameter the token goes back in")
    id: Name = Field("id", description="key of an item's id, for de-duplication and incremental marks")
    max_pages: StrictInt = Field(10, ge=1, description="stop after this many pages")
    headers: dict[StrictStr, StrictStr] = Field(default_factory=dict, description="extra request headers")


#: The options model of each built-in crawler.
BUILTIN_OPTIONS: dict[str, type[CrawlerOptions]] = {"links": LinksOptions, "api": ApiOptions}


def split_dotted(ref: str) -> tuple[str, str]:
    """'pkg.mod:Class' or 'pkg.mod.Class' -> ('pkg.mod', 'Class')."""
    if ":" in ref:
        module, _, attr = ref.partition(":")
    else:
        module, _, attr = ref.rpartition(".")
    return module, attr


def resolve_name(name: str) -> str:
    """A crawler name as written in fleet.yaml -> its dotted path."""
    return BUILTIN_CRAWLERS.get(name, name)


#: gridfleet's own top-level packages: a dotted crawler name may point into them whatever the crawler project.
OWN_PACKAGES = frozenset({"fleet", "hub", "node", "lambdas", "cli", "embedded", "cloud_init", "profiles"})


def crawler_problem(name: str, roots: list[str] | None = None) -> str | None:
    """Why `name` cannot be a crawler, or None if it can (checked without importing it). With `roots` (the
    crawler project's source roots) a dotted name must be found there or in gridfleet itself, and nothing else
    on the import path is looked at."""
    if name in BUILTIN_CRAWLERS:
        return None
    if not _DOTTED.fullmatch(name) or ("." not in name and ":" not in name):
        known = ", ".join(sorted(BUILTIN_CRAWLERS))
        return f"unknown crawler {quote(name)}: use a built-in ({known}) or a dotted path 'package.module:Class'"
    module, attr = split_dotted(name)
    top = module.partition(".")[0]
    if top in sys.stdlib_module_names:
        return (
            f"unknown crawler {quote(name)}: {quote(top)} is a module of Python's standard library, "
            "not a crawler package"
        )
    if roots is not None and top not in OWN_PACKAGES:
        spec = _find_module(module, roots)
        if spec is None:
            where = ", ".join(roots)
            return f"unknown crawler {quote(name)}: module {quote(module)} is not in the crawler project ({where})"
        return _class_problem(name, spec, attr)
    spec = _find_module(module)
    if spec is None:
        return f"unknown crawler {quote(name)}: module {quote(module)} cannot be imported"
    return _class_problem(name, spec, attr)


def _find_module(module: str, roots: list[str] | None = None) -> importlib.machinery.ModuleSpec | None:
    """The spec of `module`, found package by package without importing any of them (no `__init__` runs); with
    `roots`, its top-level package only there."""
    spec: importlib.machinery.ModuleSpec | None = None
    parts = module.split(".")
    for depth in range(1, len(parts) + 1):
        name = ".".join(parts[:depth])
        search = None if spec is None else spec.submodule_search_locations
        if spec is not None and search is None:
            return None  # the parent is a module, not a package
        try:
            if depth == 1 and roots is not None:
                search = roots
            found = importlib.machinery.PathFinder.find_spec(name, None if search is None else list(search))
            if found is None and depth == 1 and roots is None:
                # installed packages may be located by a finder of their own (editable installs); finding a
                # top-level module runs none of its code
                found = importlib.util.find_spec(name)
        except (ImportError, ValueError, OSError):
            return None
        if found is None:
            return None
        spec = found
    return spec


def _class_problem(name: str, spec: importlib.machinery.ModuleSpec, attr: str) -> str | None:
    """Why the module's source does not define `attr` at its top level; None when it does or cannot be read."""
    path = spec.origin
    if not spec.has_location or not path or not path.endswith(".py") or not os.path.isfile(path):
        return None  # an extension module, a zip, a namespace package: found is all we can say
    try:
        if os.path.getsize(path) > _MAX_SOURCE_BYTES:
            return None
        with open(path, "rb") as f:
            tree = ast.parse(f.read(), filename=path)
    except OSError:
        return None
    except (SyntaxError, ValueError, RecursionError, MemoryError) as e:
        where = f"{path}:{e.lineno}" if isinstance(e, SyntaxError) and e.lineno else path
        return f"crawler {quote(name)}: {where} cannot be parsed: {getattr(e, 'msg', None) or e}"
    names = _top_level_names(tree.body)
    if names is None or attr in names:
        return None
    return f"unknown crawler {quote(name)}: {path} defines no {quote(attr)} at its top level"


def _top_level_names(body: list[ast.stmt]) -> set[str] | None:
    """Names a module binds at its top level (inside if/try/with too); None if it cannot be told (`import *`,
    a module `__getattr__`)."""
    names: set[str] = set()
    for stmt in body:
        if isinstance(stmt, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            if stmt.name == "__getattr__":
                return None
            names.add(stmt.name)
        elif isinstance(stmt, (ast.Import, ast.ImportFrom)):
            for alias in stmt.names:
                if alias.name == "*":
                    return None
                names.add(alias.asname or alias.name.partition(".")[0])
        elif isinstance(stmt, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
            for target in targets:
                names.update(n.id for n in ast.walk(target) if isinstance(n, ast.Name))
        elif isinstance(stmt, (ast.If, ast.Try, ast.With, ast.For, ast.While)):
            blocks = [getattr(stmt, f, []) for f in ("body", "orelse", "finalbody")]
            blocks += [h.body for h in getattr(stmt, "handlers", [])]
            for block in blocks:
                inner = _top_level_names(block)
                if inner is None:
                    return None
                names |= inner
    return names
