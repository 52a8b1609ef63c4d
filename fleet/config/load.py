"""Load fleet.yaml into a frozen `Config`, with errors that name file, field and line.

The YAML is read by `fleet.config.guard`, bounded and with the line of every value kept, so a pydantic error
location becomes `fleet.yaml:14: sites[3].start_url: ...`; this module turns the plain values into a `Config`
and pydantic's errors into those one-line problems.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError
from pydantic_core import ErrorDetails

from fleet.config import Config, DuplicateSiteError, SchemaError
from fleet.config.crawlers import project_context
from fleet.config.guard import BOOL, MAX_FILE_BYTES, Composer, Loc, Problem, Refused, compose, field_name
from fleet.crawl.crawlers import OptionsError, error_text
from fleet.errors import ConfigError, quote


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


def _messages(err: ErrorDetails) -> list[tuple[Loc, str]]:
    loc: Loc = tuple(err["loc"])
    cause = (err.get("ctx") or {}).get("error")
    if isinstance(cause, DuplicateSiteError):
        return [(("sites", cause.index, "id"), str(cause))]
    if isinstance(cause, SchemaError):  # an `expect.fields` schema: each problem where it is in the schema
        return [(loc + where, msg) for where, msg in cause.problems]
    if isinstance(cause, OptionsError):  # a built-in crawler's options: located within them
        return [(loc + tuple(inner["loc"]), _message(inner, list(cause.model.model_fields))) for inner in cause.errors]
    return [(loc, _message(err, _allowed_keys(loc)))]


def _message(err: ErrorDetails, allowed: list[str] | None) -> str:
    loc: Loc = tuple(err["loc"])
    kind = err["type"]
    if kind == "extra_forbidden":
        hint = f" (allowed: {', '.join(allowed)})" if allowed else ""
        return f"unknown key {quote(loc[-1], 24)}{hint}"
    if kind == "missing":
        return "required key is missing"
    if kind == "too_short" and loc == ("sites",):
        return "at least one site is required"
    return error_text(err)


def parse_config(
    text: str, file: str = "<config>", base_dir: Path | None = None, installed_root: Path | None = None
) -> Config:
    """Validate YAML text as a Config; raise ConfigError naming file, line and field. Paths in the config
    (`crawlers.project`) are found relative to `base_dir` and made absolute; without it they are not checked. A
    config naming its crawler project by identity finds it under `installed_root` (see `project_context`)."""
    if len(text) > MAX_FILE_BYTES:
        raise ConfigError([Problem(file, None, "", f"larger than {MAX_FILE_BYTES // 2**20} MB: not a config")])
    loader, root = compose(text, file)
    if root is None:
        raise ConfigError([Problem(file, None, "", "the file is empty; it needs at least a 'sites' list")])
    composer = Composer(file, loader)
    try:
        composer.measure(root)
    except Refused as e:
        raise ConfigError([e.problem]) from None
    data = composer.value(root, ())
    if composer.problems:
        raise ConfigError(composer.problems)
    if not isinstance(data, dict):
        raise ConfigError([Problem(file, 1, "", "the top level must be a mapping with run, fleet, aws and sites")])
    try:
        return Config.model_validate(data, context=project_context(data, base_dir, installed_root))
    except ValidationError as e:
        problems = []
        for err in e.errors(include_url=False):
            if err["type"] == "too_short" and err["loc"] == ("sites",) and data.get("sites"):
                continue  # pydantic counts only the valid sites; the invalid ones have errors of their own
            for loc, msg in _messages(err):
                problems.append(Problem(file, composer.line_of(loc), field_name(loc), msg))
        raise ConfigError(problems) from None


def load_config(path: str | Path, installed_root: Path | None = None) -> Config:
    p = Path(path)
    try:
        with p.open("rb") as f:
            raw = f.read(MAX_FILE_BYTES + 1)  # a bound even for what stat cannot size (a pipe, /dev/zero)
    except FileNotFoundError:
        raise ConfigError([Problem(str(p), None, "", "no such file")]) from None
    except OSError as e:
        raise ConfigError([Problem(str(p), None, "", f"cannot read: {e.strerror or e}")]) from None
    if len(raw) > MAX_FILE_BYTES:
        raise ConfigError([Problem(str(p), None, "", f"larger than {MAX_FILE_BYTES // 2**20} MB: not a config")])
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        line = raw.count(b"\n", 0, e.start) + 1
        raise ConfigError(
            [Problem(str(p), line, "", f"not UTF-8 text (byte 0x{raw[e.start]:02x} at offset {e.start})")]
        ) from None
    return parse_config(text, str(p), p.resolve().parent, installed_root)


class _Dumper(yaml.SafeDumper):
    """Quotes y and n too, which `parse_config` refuses as plain keys (YAML 1.1 booleans)."""


_Dumper.add_implicit_resolver(BOOL, re.compile(r"^(?:y|Y|n|N)$"), list("yYnN"))


def dump_config(config: Config, *, secrets: bool = False) -> str:
    """YAML text that `parse_config` reads back as the same Config; without `secrets` (the nodes' copy) the
    notification webhook is left out."""
    data = config.model_dump(mode="json", exclude_none=True)
    if secrets and config.notify is not None and config.notify.webhook_url is not None:
        data.setdefault("notify", {})["webhook_url"] = config.notify.webhook_url.get_secret_value()
    return yaml.dump(data, Dumper=_Dumper, sort_keys=False)
