"""A small evaluator of the Terraform expressions infra/terraform uses, on python-hcl2's parse trees.

python-hcl2 parses HCL into a Lark tree; this module indexes a directory's blocks (`TfModule`) and evaluates
their expressions (`Evaluator`): literals, strings with `${...}` interpolation and heredocs, tuples and objects,
`var.*`, `local.*`, `data.*`, `path.module`, references to resources (`aws_iam_role.hub.arn`, an instance of a
`for_each` resource by key, a `count` resource's splat), `each.*` and `count.index`, `for` expressions,
conditionals, comparison, arithmetic and logic, the functions in `FUNCTIONS` and `try` (lazy, as Terraform's).
Names are resolved through `Namespace` objects the caller supplies, so resources and data sources are made only
when an expression reaches them. Anything else (template directives, an unknown function, an attribute that is
not there) raises `TfError`, one line naming the file, the line, the block and what could not be evaluated:
never a guessed value.
"""

from __future__ import annotations

import base64
import textwrap
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import hcl2
from lark import Token, Tree

from twin.terraform.functions import BINARY, FUNCTIONS, as_text, unescape


class TfError(ValueError):
    """An expression or block the twin cannot evaluate or apply; the message is one line saying where."""


@dataclass
class Body:
    """One block's body: its attributes (unevaluated expressions) and nested blocks, in file order."""

    file: str
    attrs: dict[str, Tree] = field(default_factory=dict)
    blocks: list[tuple[str, list[str], Body]] = field(default_factory=list)
    line: int = 0


def _parts(tree: Tree) -> list[Any]:
    """The children that carry meaning: no newlines or comments, no punctuation tokens."""
    return [c for c in tree.children if isinstance(c, Tree) and c.data != "new_line_or_comment"]


def _name(tree: Tree) -> str:
    """A block type, label or attribute name (identifier, keyword or quoted string)."""
    if tree.data == "string":
        return "".join(str(p.children[0]) for p in tree.children if isinstance(p, Tree))
    return str(tree.children[0])


def _body(tree: Tree, file: str) -> Body:
    body = Body(file, line=getattr(tree.meta, "line", 0))
    for child in _parts(tree):
        if child.data == "attribute":
            body.attrs[_name(child.children[0])] = child.children[-1]
        elif child.data == "block":
            names = [_name(c) for c in _parts(child) if c.data != "body"]
            inner = next(c for c in _parts(child) if c.data == "body")
            body.blocks.append((names[0], names[1:], _body(inner, file)))
    return body


class TfModule:
    """The .tf files of one directory, their blocks indexed by kind: variables, locals, resources, data, outputs
    (and a Packer template's sources, when `pattern` picks its .pkr.hcl files: the same language)."""

    def __init__(self, directory: Path, pattern: str = "*.tf") -> None:
        self.directory = directory
        self.variables: dict[str, Body] = {}
        self.locals: dict[str, tuple[str, Tree]] = {}
        self.resources: dict[tuple[str, str], Body] = {}
        self.data: dict[tuple[str, str], Body] = {}
        self.sources: dict[tuple[str, str], Body] = {}
        self.outputs: dict[str, Body] = {}
        self.providers: list[Body] = []
        self.texts: dict[str, str] = {}
        paths = sorted(directory.glob(pattern))
        if not paths:
            raise TfError(f"{directory}: no {pattern} files")
        for path in paths:
            self._load(path)

    def _load(self, path: Path) -> None:
        text = path.read_text()
        self.texts[path.name] = text
        try:
            root = _body(_parts(hcl2.parses_to_tree(text))[0], path.name)
        except Exception as e:  # lark's errors carry the position; one line of it is enough
            raise TfError(f"{path.name}: does not parse: {str(e).splitlines()[0]}") from None
        for kind, labels, body in root.blocks:
            if kind == "variable":
                self.variables[labels[0]] = body
            elif kind == "locals":
                self.locals.update({k: (path.name, v) for k, v in body.attrs.items()})
            elif kind in ("resource", "data", "source"):
                index = {"resource": self.resources, "data": self.data, "source": self.sources}[kind]
                index[(labels[0], labels[1])] = body
            elif kind == "output":
                self.outputs[labels[0]] = body
            elif kind == "provider":
                self.providers.append(body)

    def snippet(self, file: str, tree: Tree) -> str:
        """The source text of an expression, on one line, for error messages."""
        meta = tree.meta
        text = self.texts.get(file, "")
        if getattr(meta, "empty", True) or not text:
            return "<expression>"
        return " ".join(text[meta.start_pos : meta.end_pos].split())[:120]


class Namespace:
    """A name whose attributes are looked up on demand (`var`, `local`, `data.<type>`, a resource type)."""

    def __init__(self, label: str, get: Callable[[str], Any]) -> None:
        self.label = label
        self._get = get

    def attr(self, name: str) -> Any:
        return self._get(name)


@dataclass(frozen=True)
class Where:
    """Where an expression sits: the file and the block (e.g. `aws_launch_template.hub`), for error messages."""

    file: str
    block: str


class Evaluator:
    """Evaluates expression trees of one module. `roots` maps the first name of a reference (`var`, `local`,
    `data`, `path`, a resource type) to a `Namespace` or a value; `files` are contents that stand in for paths."""

    def __init__(self, module: TfModule, roots: Mapping[str, Any], files: Mapping[str, bytes] | None = None) -> None:
        self.module = module
        self.roots = roots
        self.files = dict(files or {})

    def fail(self, where: Where, tree: Tree | None, what: str) -> TfError:
        line = getattr(tree.meta, "line", None) if tree is not None else None
        place = f"{where.file}:{line}" if line else where.file
        source = f" (in {self.module.snippet(where.file, tree)})" if tree is not None else ""
        return TfError(f"{place}: {where.block}: {what}{source}")

    def read_file(self, path: str) -> bytes:
        if path in self.files:
            return self.files[path]
        return Path(path).read_bytes()

    def evaluate(self, tree: Tree, where: Where, scope: Mapping[str, Any] | None = None) -> Any:
        method = getattr(self, f"_x_{tree.data}", None)
        if method is None:
            raise self.fail(where, tree, f"the twin does not evaluate {tree.data} expressions")
        try:
            return method(tree, where, dict(scope or {}))
        except TfError:
            raise
        except (TypeError, ValueError, KeyError, IndexError, OSError, ZeroDivisionError) as e:
            raise self.fail(where, tree, str(e) or type(e).__name__) from None

    # --- terms ---------------------------------------------------------------------------------------

    def _x_expr_term(self, tree: Tree, where: Where, scope: dict[str, Any]) -> Any:
        inner = _parts(tree)
        if len(inner) != 1:
            raise self.fail(where, tree, "unexpected expression shape")
        return self.evaluate(inner[0], where, scope)

    def _x_int_lit(self, tree: Tree, where: Where, scope: dict[str, Any]) -> Any:
        text = str(tree.children[0])
        return float(text) if tree.data == "float_lit" else int(text)

    _x_float_lit = _x_int_lit

    def _x_literal_value(self, tree: Tree, where: Where, scope: dict[str, Any]) -> Any:
        return {"true": True, "false": False, "null": None}[str(tree.children[0])]

    def _x_identifier(self, tree: Tree, where: Where, scope: dict[str, Any]) -> Any:
        name = str(tree.children[0])
        if name in scope:
            return scope[name]
        if name in self.roots:
            return self.roots[name]
        raise self.fail(where, tree, f"unknown name {name!r}")

    def _x_tuple(self, tree: Tree, where: Where, scope: dict[str, Any]) -> Any:
        return [self.evaluate(c, where, scope) for c in _parts(tree)]

    def _x_object(self, tree: Tree, where: Where, scope: dict[str, Any]) -> Any:
        out: dict[str, Any] = {}
        for elem in _parts(tree):
            key_tree, value_tree = _parts(elem)
            key_term = _parts(key_tree)[0]
            bare = key_term.data == "expr_term" and [c.data for c in _parts(key_term)] == ["identifier"]
            if key_term.data in ("identifier", "keyword") or bare:
                key: Any = _name(_parts(key_term)[0] if bare else key_term)
            else:
                key = self.evaluate(key_term, where, scope)
            out[as_text(key)] = self.evaluate(value_tree, where, scope)
        return out

    # --- strings ---------------------------------------------------------------------------------------

    def _x_string(self, tree: Tree, where: Where, scope: dict[str, Any]) -> Any:
        pieces: list[Any] = []
        for part in _parts(tree):
            child = part.children[0]
            if isinstance(child, Tree) and child.data == "interpolation":
                pieces.append((self.evaluate(_parts(child)[0], where, scope),))
            elif isinstance(child, Tree):
                raise self.fail(where, tree, "template directives (%{...}) are not evaluated by the twin")
            elif child.type in ("ESCAPED_INTERPOLATION", "ESCAPED_DIRECTIVE"):  # $${ and %%{ are literal
                pieces.append(str(child)[1:])
            else:
                pieces.append(unescape(str(child)))
        if len(pieces) == 1 and isinstance(pieces[0], tuple):
            return pieces[0][0]  # "${x}" is x itself, not its text
        return "".join(as_text(p[0]) if isinstance(p, tuple) else p for p in pieces)

    def _x_heredoc_template(self, tree: Tree, where: Where, scope: dict[str, Any]) -> Any:
        body = "\n".join(str(tree.children[0]).split("\n")[1:-2]) + "\n"  # without the <<MARK and MARK lines
        body = textwrap.dedent(body) if tree.data == "heredoc_template_trim" else body
        return self._template(body, tree, where, scope)

    _x_heredoc_template_trim = _x_heredoc_template

    def _template(self, text: str, tree: Tree, where: Where, scope: dict[str, Any]) -> str:
        """A heredoc's `${...}` interpolations (hcl2 keeps a heredoc as one token); `$${` is a literal `${`."""
        out, i = [], 0
        while i < len(text):
            if text.startswith("$${", i) or text.startswith("%%{", i):
                out.append(text[i + 1 : i + 3])
                i += 3
            elif text.startswith("%{", i):
                raise self.fail(where, tree, "template directives (%{...}) are not evaluated by the twin")
            elif text.startswith("${", i):
                depth, j = 1, i + 2
                while depth and j < len(text):
                    depth += {"{": 1, "}": -1}.get(text[j], 0)
                    j += 1
                inner = _parts(_parts(hcl2.parses_to_tree(f"x = {text[i + 2 : j - 1]}"))[0])[0]
                try:  # the inner expression's positions are not the file's: name the heredoc instead
                    out.append(as_text(self.evaluate(inner.children[-1], where, scope)))
                except TfError as e:
                    raise self.fail(where, tree, f"in ${{{text[i + 2 : j - 1]}}}: {e}") from None
                i = j
            else:
                out.append(text[i])
                i += 1
        return "".join(out)

    # --- operators -------------------------------------------------------------------------------------

    def _x_conditional(self, tree: Tree, where: Where, scope: dict[str, Any]) -> Any:
        cond, yes, no = _parts(tree)
        test = self.evaluate(cond, where, scope)
        if not isinstance(test, bool):
            raise self.fail(where, tree, "a condition must be true or false")
        return self.evaluate(yes if test else no, where, scope)

    def _x_binary_op(self, tree: Tree, where: Where, scope: dict[str, Any]) -> Any:
        left, term = _parts(tree)
        op_tree, right = _parts(term)
        op = str(op_tree.children[0])
        a = self.evaluate(left, where, scope)
        if op == "&&" and a is False or op == "||" and a is True:
            return a
        b = self.evaluate(right, where, scope)
        if op in "+-*/%" and not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (a, b)):
            raise self.fail(where, tree, f"{op} takes numbers (Terraform joins strings only by interpolation)")
        return BINARY[op](a, b)

    def _x_unary_op(self, tree: Tree, where: Where, scope: dict[str, Any]) -> Any:
        op = str(tree.children[0])
        value = self.evaluate(_parts(tree)[0], where, scope)
        return (not value) if op == "!" else -value

    # --- references ------------------------------------------------------------------------------------

    def attr(self, value: Any, name: str, tree: Tree, where: Where) -> Any:
        if isinstance(value, Namespace):
            return value.attr(name)
        if isinstance(value, Mapping):
            if name not in value:
                raise self.fail(where, tree, f"no attribute {name!r} here (has: {', '.join(sorted(value))})")
            return value[name]
        raise self.fail(where, tree, f"{type(value).__name__} has no attribute {name!r}")

    def index(self, value: Any, key: Any, tree: Tree, where: Where) -> Any:
        if isinstance(value, Namespace):
            return value.attr(as_text(key))
        if isinstance(value, Mapping):
            if as_text(key) not in value:
                raise self.fail(where, tree, f"no key {key!r} here (has: {', '.join(sorted(value))})")
            return value[as_text(key)]
        if isinstance(value, list) and isinstance(key, int) and 0 <= key < len(value):
            return value[key]
        raise self.fail(where, tree, f"cannot index {type(value).__name__} with {key!r}")

    def _step(self, value: Any, step: Tree, where: Where, scope: dict[str, Any]) -> Any:
        if step.data == "get_attr":
            return self.attr(value, _name(_parts(step)[0]), step, where)
        if step.data == "braces_index":
            return self.index(value, self.evaluate(_parts(step)[0], where, scope), step, where)
        if step.data == "short_index":
            return self.index(value, int(str(step.children[-1])), step, where)
        raise self.fail(where, step, f"the twin does not evaluate {step.data}")

    def _x_get_attr_expr_term(self, tree: Tree, where: Where, scope: dict[str, Any]) -> Any:
        base, step = _parts(tree)
        return self._step(self.evaluate(base, where, scope), step, where, scope)

    _x_index_expr_term = _x_get_attr_expr_term

    def _x_full_splat_expr_term(self, tree: Tree, where: Where, scope: dict[str, Any]) -> Any:
        base, splat = _parts(tree)
        value = self.evaluate(base, where, scope)
        items = [] if value is None else value if isinstance(value, list) else [value]
        out = []
        for item in items:
            for step in _parts(splat):
                item = self._step(item, step, where, scope)
            out.append(item)
        return out

    _x_attr_splat_expr_term = _x_full_splat_expr_term

    # --- functions and for expressions -----------------------------------------------------------------

    def _x_function_call(self, tree: Tree, where: Where, scope: dict[str, Any]) -> Any:
        name = _name(tree.children[0])
        arg_trees = [a for c in _parts(tree)[1:] for a in _parts(c)]
        if name == "try":  # lazy: the first argument that evaluates without an error
            for arg in arg_trees:
                try:
                    return self.evaluate(arg, where, scope)
                except TfError:
                    continue
            raise self.fail(where, tree, "no argument of try() could be evaluated")
        expand = any(isinstance(t, Token) and t.type == "ELLIPSIS" for c in _parts(tree)[1:] for t in c.children)
        args = [self.evaluate(a, where, scope) for a in arg_trees]
        if expand:
            args = args[:-1] + list(args[-1])
        if name in ("file", "filebase64"):
            data = self.read_file(args[0])
            return data.decode() if name == "file" else base64.b64encode(data).decode()
        if name not in FUNCTIONS:
            raise self.fail(where, tree, f"the twin does not evaluate the function {name}()")
        return FUNCTIONS[name](*args)

    def _for(self, tree: Tree, where: Where, scope: dict[str, Any]) -> list[tuple[dict[str, Any], list[Tree]]]:
        """Each iteration's scope and the trees to evaluate in it (those of the iterations the `if` keeps)."""
        intro, *rest = _parts(tree)
        names = [_name(c) for c in _parts(intro) if c.data == "identifier"]
        collection = self.evaluate(_parts(intro)[-1], where, scope)
        if isinstance(collection, Mapping):
            pairs = [(k, collection[k]) for k in sorted(collection)]
        elif isinstance(collection, list):
            pairs = list(enumerate(collection))
        else:
            raise self.fail(where, tree, f"cannot iterate over {type(collection).__name__}")
        cond = rest[-1] if rest and rest[-1].data == "for_cond" else None
        exprs = rest[:-1] if cond is not None else rest
        out = []
        for key, value in pairs:
            inner = dict(scope)
            inner.update(zip(names, (key, value), strict=True) if len(names) == 2 else {names[0]: value})
            if cond is None or self.evaluate(_parts(cond)[0], where, inner) is True:
                out.append((inner, exprs))
        return out

    def _x_for_tuple_expr(self, tree: Tree, where: Where, scope: dict[str, Any]) -> Any:
        return [self.evaluate(exprs[0], where, inner) for inner, exprs in self._for(tree, where, scope)]

    def _x_for_object_expr(self, tree: Tree, where: Where, scope: dict[str, Any]) -> Any:
        if any(isinstance(t, Token) and t.type == "ELLIPSIS" for t in tree.children):
            raise self.fail(where, tree, "grouping (...) in a for expression is not evaluated by the twin")
        out: dict[str, Any] = {}
        for inner, (key, value) in self._for(tree, where, scope):
            out[as_text(self.evaluate(key, where, inner))] = self.evaluate(value, where, inner)
        return out
