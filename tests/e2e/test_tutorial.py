"""The tutorial, docs/start/first-crawler.md, done as its reader does it: every command it shows, in its order, in
one fresh directory, on the embedded default (a real Selenium Grid and Chromium, moto as AWS), each printing what
the page shows and exiting as the page says.

How the page is read:

- A fenced block ```` ```console ```` is run. Each of its lines that starts with `$ ` is a command, run by bash in
  the directory the commands so far left it in (a command that is only `cd DIR` changes it). The lines after a
  command, up to the next one, are what the page shows of its output: stdout and stderr together, as a terminal
  shows them. They must be the whole output, line by line (trailing spaces aside). A line `...` stands for any
  number of lines, and `...` inside a line for any text in it. A command the page expects to fail ends with a
  comment `# exit N`; any other must exit 0.
- A block ```` ```{code-block} LANG ```` with a `:caption: PATH` option is a file the reader writes: its body (the
  lines after its options, less one blank line) is written to PATH, relative to that directory, before the next
  command runs.
- Every other block is for people only.

A fence may be indented (a block inside a list item): its lines lose that indentation. The commands run with
`gridfleet` on PATH from this checkout's `.venv/bin`, HOME and GRIDFLEET_HOME in directories of the test's own,
and the `gf` fixture brings down any stack the page left up, even when a command fails.
"""

from __future__ import annotations

import os
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.e2e.conftest import ROOT

pytestmark = pytest.mark.e2e

PAGE = ROOT / "docs" / "start" / "first-crawler.md"
BIN = ROOT / ".venv" / "bin"
COMMAND_TIMEOUT_S = 180

_FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<ticks>`{3,})(?P<info>[^`]*)$")
_EXIT = re.compile(r"\s+#\s*exit\s+(?P<code>\d+)\s*$")
_CD = re.compile(r"^cd\s+(?P<dir>\S+)$")
_ANY_LINES = r"(?:[^\n]*\n)*?"


@dataclass(frozen=True)
class File:
    """A file the page tells the reader to write."""

    path: str
    text: str
    where: str


@dataclass(frozen=True)
class Command:
    """A command of a console block, with the output the page shows and the exit code it expects."""

    line: str
    shown: tuple[str, ...]
    exit_code: int
    where: str


def fences(text: str) -> list[tuple[int, str, list[str]]]:
    """The page's fenced blocks: (the line number of the opening fence, its info string, its lines less the
    fence's indentation)."""
    lines = text.splitlines()
    blocks = []
    i = 0
    while i < len(lines):
        opening = _FENCE.match(lines[i])
        if opening is None:
            i += 1
            continue
        indent, ticks = len(opening["indent"]), len(opening["ticks"])
        closing = re.compile(rf"^[ \t]*`{{{ticks},}}[ \t]*$")
        end = next((j for j in range(i + 1, len(lines)) if closing.match(lines[j])), None)
        assert end is not None, f"{PAGE.name}:{i + 1}: a fence that is never closed"
        body = [line[indent:] if not line[:indent].strip() else line for line in lines[i + 1 : end]]
        blocks.append((i + 1, opening["info"].strip(), body))
        i = end + 1
    return blocks


def caption(body: list[str]) -> tuple[str | None, list[str]]:
    """A code-block directive's `:caption:` and its content (after its option lines and one blank line)."""
    options = {}
    k = 0
    while k < len(body) and body[k].lstrip().startswith(":"):
        key, _, value = body[k].lstrip()[1:].partition(":")
        options[key.strip()] = value.strip()
        k += 1
    if k < len(body) and not body[k].strip():
        k += 1
    return options.get("caption") or None, body[k:]


def commands(line_no: int, body: list[str], where: str) -> list[Command]:
    """The commands of one console block, each with the lines shown after it."""
    found: list[tuple[int, str, list[str]]] = []
    for k, line in enumerate(body):
        if line.startswith("$ "):
            found.append((line_no + 1 + k, line[2:], []))
        else:
            assert found, f"{where}, line {line_no + 1 + k}: output before any `$ ` command: {line!r}"
            found[-1][2].append(line)
    out = []
    for at, line, shown in found:
        want = _EXIT.search(line)
        cmd = line[: want.start()] if want else line
        out.append(Command(cmd.strip(), tuple(shown), int(want["code"]) if want else 0, f"{where}, line {at}"))
    return out


def read_page(text: str) -> list[File | Command]:
    """What the reader does, in the page's order: files to write and commands to run."""
    steps: list[File | Command] = []
    for n, (line_no, info, body) in enumerate(fences(text), start=1):
        where = f"{PAGE.name} block {n} (line {line_no})"
        if info == "console":
            steps += commands(line_no, body, where)
        elif info.startswith("{code-block}"):
            path, content = caption(body)
            if path is not None:
                steps.append(File(path, "".join(line + "\n" for line in content), where))
    return steps


def _line_pattern(line: str) -> str:
    return "[^\n]*?".join(re.escape(part) for part in line.rstrip().split("...")) + "\n"


def _pattern(shown: tuple[str, ...]) -> str:
    return "".join(_ANY_LINES if line.strip() == "..." else _line_pattern(line) for line in shown)


def _plain(output: str) -> str:
    return "".join(line.rstrip() + "\n" for line in output.splitlines())


def shows(shown: tuple[str, ...], output: str) -> bool:
    """Whether `output` is what the page shows: line by line, `...` as above."""
    return re.fullmatch(_pattern(shown), _plain(output)) is not None


def first_unmatched(shown: tuple[str, ...], output: str) -> str:
    """The first shown line the output does not bear out, to name it in a failure."""
    text = _plain(output)
    for k in range(1, len(shown) + 1):
        if re.match(_pattern(shown[:k]), text) is None:
            return f"the first shown line it does not match is {shown[k - 1]!r}"
    return "every shown line matched, but the output goes on past the last one"


def tutorial_env(gf, open_dir: Path) -> dict[str, str]:
    home = open_dir / "user-home"
    home.mkdir()
    env = {k: v for k, v in gf.env.items() if k not in ("GRIDFLEET_LOG_FORMAT", "VIRTUAL_ENV")}
    return {**env, "HOME": str(home), "PATH": f"{BIN}{os.pathsep}{env.get('PATH', '')}"}


def run(cmd: Command, cwd: Path, env: dict[str, str]) -> Path:
    """Run one command of the page and check it; the directory the next command runs in."""
    if cd := _CD.match(cmd.line):
        target = cwd / cd["dir"]
        assert target.is_dir(), f"{cmd.where}: `{cmd.line}`: no directory {target}"
        assert not cmd.shown and cmd.exit_code == 0, f"{cmd.where}: `cd` prints nothing and exits 0"
        return target
    try:
        p = subprocess.run(
            ["bash", "-c", cmd.line],
            cwd=cwd,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            timeout=COMMAND_TIMEOUT_S,
        )
    except subprocess.TimeoutExpired as e:
        out = e.output.decode(errors="replace") if isinstance(e.output, bytes) else (e.output or "")
        raise AssertionError(f"{cmd.where}: `{cmd.line}` still running after {COMMAND_TIMEOUT_S} s:\n{out}") from None
    assert p.returncode == cmd.exit_code, (
        f"{cmd.where}: `{cmd.line}` exited {p.returncode}, the page shows exit {cmd.exit_code}; "
        f"its output:\n{p.stdout[-6000:]}"
    )
    assert shows(cmd.shown, p.stdout), (
        f"{cmd.where}: `{cmd.line}` printed what the page does not show ({first_unmatched(cmd.shown, p.stdout)}).\n"
        "The page shows:\n" + "\n".join(cmd.shown) + "\nIt printed:\n" + p.stdout[-6000:]
    )
    return cwd


def test_every_command_of_the_tutorial_prints_what_the_page_shows_and_leaves_nothing_running(gf, open_dir):
    steps = read_page(PAGE.read_text())
    ran = [s.line for s in steps if isinstance(s, Command)]
    assert any(isinstance(s, File) for s in steps) and "gridfleet local down" in ran, ran
    assert (BIN / "gridfleet").is_file(), f"no {BIN / 'gridfleet'} (make setup)"
    cwd = open_dir / "work"  # a directory the crawl user can traverse, as the reader's own would be
    cwd.mkdir()
    env = tutorial_env(gf, open_dir)
    for step in steps:
        if isinstance(step, File):
            path = cwd / step.path
            assert path.parent.is_dir(), f"{step.where}: the page writes {step.path} before making its directory"
            path.write_text(step.text)
        else:
            cwd = run(step, cwd, env)
    assert gf.wait_no_leftovers() == []  # the page's `local down` stopped all the page started


SAMPLE = """\
Some text.

```console
$ mkdir d
$ cd d
```

1. A list item:

   ```{code-block} yaml
   :caption: d/f.yaml

   a: 1
   ```

```yaml
b: 2
```

```console
$ false  # exit 1
$ printf 'one\\ntwo\\n'
one
...
```
"""


def test_the_page_is_read_as_its_docstring_says():
    steps = read_page(SAMPLE)
    assert [type(s).__name__ for s in steps] == ["Command", "Command", "File", "Command", "Command"]
    assert steps[2] == File("d/f.yaml", "a: 1\n", f"{PAGE.name} block 2 (line 10)")
    failing, shown = steps[3], steps[4]
    assert isinstance(failing, Command) and isinstance(shown, Command)
    assert (failing.line, failing.exit_code, failing.shown) == ("false", 1, ())
    assert shown.shown == ("one", "...") and shown.where == f"{PAGE.name} block 4 (line 20), line 22"


def test_an_output_matches_only_what_the_page_shows():
    assert shows(("a", "...", "c ... e"), "a\nb\nb2\nc d e  \n")
    assert shows(("...",), "") and shows((), "") and shows(("a", "..."), "a\n")
    assert not shows(("a", "c"), "a\nb\nc\n")  # without `...`, no line may be left out
    assert not shows(("a",), "a\nb\n")  # nor added at the end
    assert not shows(("c ... e",), "c d\ne\n")  # `...` in a line stays in that line
    assert not shows((), "something\n")
    assert first_unmatched(("a", "x"), "a\nb\n") == "the first shown line it does not match is 'x'"
