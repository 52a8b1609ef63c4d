"""The crawlers' pinned requirements (`crawlers.requirements`, cli.packaging.requirements): what a pin needs must
be pinned too or come with gridfleet, said up front by `validate` and before the local stack starts by `run
--local`; the pins installed once per hash of them, where `crawl` and the local nodes import them from.

pip works on a package index of hand-written wheels in the test's directory (`PIP_NO_INDEX`, `PIP_FIND_LINKS`),
so these tests need no network; the slow test at the end crawls with a real package from the package index.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from cli.envs.local import LocalEnv
from cli.main import main
from cli.packaging import requirements
from cli.packaging.requirements import Dist, unmet
from fleet.config.load import load_config
from fleet.errors import UsageError
from tests.helpers.crawler_project import make_project, make_wheel

SOURCE = Path(__file__).resolve().parents[2]

#: A crawler of the project that needs no browser and hands out, as its one item, what the pinned `gfneeds`
#: (which needs `gfdep`) says: it runs only where both were installed.
CRAWLER = """\
from node.crawler import BaseCrawler


class NeedsCrawler(BaseCrawler):
    needs_browser = False

    def crawl(self):
        import gfneeds

        return [{"id": "1", "says": gfneeds.say()}]
"""
NEEDS = "import gfdep\n\n\ndef say():\n    return 'gfneeds ' + gfdep.VERSION\n"


@pytest.fixture
def index(tmp_path, monkeypatch):
    """A package index of two wheels, `gfneeds 1.0` (needs `gfdep>=2`) and `gfdep 2.1` and `1.0`, which pip uses
    and nothing else."""
    wheels = tmp_path / "index"
    make_wheel(wheels, "gfneeds", "1.0", ("gfdep>=2", 'gfextra; extra == "fast"'), NEEDS)
    make_wheel(wheels, "gfdep", "2.1")
    make_wheel(wheels, "gfdep", "1.0")
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(wheels))
    monkeypatch.setenv("PIP_DISABLE_PIP_VERSION_CHECK", "1")
    monkeypatch.setenv("GRIDFLEET_HOME", str(tmp_path / "home"))
    return wheels


@pytest.fixture
def cli(tmp_path, monkeypatch, capsys):
    """`gridfleet ARGV` in this process: (exit code, stdout, stderr). Each call starts from the import path and
    the modules as they were: a project of another test, or its pins, is never found again."""
    monkeypatch.chdir(tmp_path)
    path, modules = sys.path[:], set(sys.modules)
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level

    def forget() -> None:
        sys.path[:] = path
        for name in set(sys.modules) - modules:
            del sys.modules[name]

    def run(*argv: str) -> tuple[int, str, str]:
        forget()
        try:
            code = main(list(argv))
        finally:
            root.handlers[:], root.level = handlers, level
        out, err = capsys.readouterr()
        return code, out, err

    yield run
    forget()


def project_config(tmp_path: Path, pins: str, dependencies: str = "[]", package: bool = False) -> Path:
    """conf/fleet.yaml naming conf/team (its crawler `teamcrawlers.needs:NeedsCrawler`) and conf/requirements.txt;
    with `package`, the project is the plain package directory conf/teamcrawlers (installed without pip)."""
    if package:
        team = tmp_path / "conf" / "teamcrawlers"
        team.mkdir(parents=True)
        (team / "__init__.py").write_text("")
        (team / "needs.py").write_text(CRAWLER)
    else:
        team = make_project(tmp_path / "conf" / "team", dependencies=dependencies)
        (team / "teamcrawlers" / "needs.py").write_text(CRAWLER)
    (tmp_path / "conf" / "requirements.txt").write_text(pins)
    path = tmp_path / "conf" / "fleet.yaml"
    path.write_text(
        f"crawlers: {{project: ./{team.name}, requirements: requirements.txt}}\n"
        "sites:\n  - {id: shop, start_url: 'http://a.test/', crawler: 'teamcrawlers.needs:NeedsCrawler'}\n"
    )
    return path


# --- the check ------------------------------------------------------------------------------------------------
def test_what_a_pin_needs_is_named_with_who_needs_it_unless_a_pin_or_gridfleet_provides_it():
    pins = [
        Dist("a", "1", ("selenium>=4", "b>=2", "c==1.0", 'd; extra == "x"', 'e; python_version < "3"')),
        Dist("b", "1.5"),
    ]
    assert unmet(pins) == ["a 1 needs b>=2, not 1.5", "a 1 needs c==1.0"]  # selenium comes with gridfleet
    assert unmet(pins, provided=[Dist("c", "1.0"), Dist("B", "2.0")]) == ["a 1 needs b>=2, not 1.5"]
    assert unmet([Dist("a", "1", ("b>=2",))], provided=[Dist("b", "2.0")]) == []


def test_validate_names_a_missing_transitive_requirement_in_one_line_and_starts_nothing(tmp_path, index, cli):
    config = project_config(tmp_path, "gfneeds==1.0\n")
    code, out, err = cli("validate", "--config", str(config))
    assert code == 2, err
    assert err.splitlines() == [
        f"gridfleet: error: {tmp_path}/conf/requirements.txt: gfneeds 1.0 needs gfdep>=2: neither gridfleet's "
        f"environment nor crawlers.requirements provides it: pin it (name==version) in "
        f"{tmp_path}/conf/requirements.txt"
    ]
    assert not (tmp_path / "home").exists()  # nothing installed, nothing started

    (tmp_path / "conf" / "requirements.txt").write_text("gfneeds==1.0\ngfdep==1.0\n")
    code, out, err = cli("validate", "--config", str(config))
    assert code == 2 and "gfneeds 1.0 needs gfdep>=2, not 1.0" in err.splitlines()[-1], err

    (tmp_path / "conf" / "requirements.txt").write_text("gfneeds==1.0\ngfdep==2.1\n")
    code, out, err = cli("validate", "--config", str(config))
    assert code == 0, err
    assert f"crawlers.requirements {tmp_path}/conf/requirements.txt: 2 pins, each one's needs met" in out
    assert not (tmp_path / "home").exists()


def test_validate_names_a_pin_the_index_does_not_have_and_the_projects_own_unmet_dependency(tmp_path, index, cli):
    config = project_config(tmp_path, "gfnothere==1.0\n")
    code, out, err = cli("validate", "--config", str(config))
    assert code == 2 and len(err.splitlines()) == 1, err
    assert "pip could not find gfnothere==1.0" in err and "gfnothere" in err.split("find ", 1)[1]

    config = project_config(tmp_path, "gfdep==2.1\n", dependencies='["gfdep>=2", "gfother==3"]')
    code, out, err = cli("validate", "--config", str(config))
    assert code == 2, err
    assert err.splitlines() == [
        f"gridfleet: error: crawler project {tmp_path}/conf/team: teamcrawlers 1.0.0 needs gfother==3: neither "
        f"gridfleet's environment nor crawlers.requirements provides it: pin it (name==version) in "
        f"{tmp_path}/conf/requirements.txt"
    ]


def test_run_local_refuses_a_missing_requirement_before_the_stack_starts(tmp_path, index):
    class NoStack:
        """The stack a run would start: it must not be asked to."""

        dir = tmp_path / "home" / "local"

        def running(self):
            raise AssertionError("the stack was looked at before the crawlers were checked")

        up = running

    config = load_config(project_config(tmp_path, "gfneeds==1.0\n"))
    env = LocalEnv(config, stack=NoStack(), home=tmp_path / "home")  # type: ignore[arg-type]
    with pytest.raises(UsageError, match=r"requirements.txt: gfneeds 1.0 needs gfdep>=2: neither"):
        with env.hold("r1"):
            pass


# --- the install ----------------------------------------------------------------------------------------------
def test_the_pins_are_installed_once_per_hash_of_them_and_the_local_nodes_import_them_beside_the_project(
    tmp_path, index, monkeypatch
):
    config = load_config(project_config(tmp_path, "gfneeds==1.0\ngfdep==2.1\n", package=True))
    root = requirements.requirements_root(tmp_path / "home")
    site = requirements.install(config.crawlers.requirements, root)
    assert site is not None and site.parent == root and (site / "gfneeds.py").is_file()
    calls = []
    monkeypatch.setattr(requirements, "pip", lambda *a: calls.append(a))
    assert requirements.install(config.crawlers.requirements, root) == site and calls == []  # cached
    (tmp_path / "conf" / "requirements.txt").write_text("gfdep==2.1\ngfneeds==1.0  # same pins, other order\n")
    assert requirements.install(config.crawlers.requirements, root) == site and calls == []
    monkeypatch.undo()
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(index))
    (tmp_path / "conf" / "requirements.txt").write_text("gfdep==2.1\n")
    assert requirements.install(config.crawlers.requirements, root) not in (None, site)  # other pins: other install

    (tmp_path / "conf" / "requirements.txt").write_text("gfneeds==1.0\ngfdep==2.1\n")
    env = LocalEnv(config, home=tmp_path / "home")
    env._install_crawlers()
    project_dir, pins_dir = env.crawler_path
    assert pins_dir == site and project_dir.parent == tmp_path / "home" / "local" / "crawlers"
    node = subprocess.run(
        [sys.executable, "-c", "from teamcrawlers.needs import NeedsCrawler; import gfneeds; print(gfneeds.say())"],
        env={"PYTHONPATH": f"{project_dir}:{pins_dir}:{SOURCE}"},
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert node.stdout.strip() == "gfneeds 2.1", node.stderr


def test_crawl_imports_the_pinned_requirements_from_their_install(tmp_path, index, cli):
    config = project_config(tmp_path, "gfneeds==1.0\ngfdep==2.1\n")
    code, out, err = cli("crawl", "shop", "--config", str(config))
    assert code == 0, err
    assert [json.loads(line) for line in out.splitlines()] == [{"id": "1", "says": "gfneeds 2.1"}]
    installed = list(requirements.requirements_root(tmp_path / "home").iterdir())
    assert len(installed) == 1 and (installed[0] / "gfdep.py").is_file()

    (tmp_path / "conf" / "requirements.txt").write_text("gfneeds==1.0\n")  # its dependency left out
    code, out, err = cli("crawl", "shop", "--config", str(config))
    assert code == 2 and out == "", err
    assert err.splitlines()[-1].startswith(f"gridfleet: error: {tmp_path}/conf/requirements.txt: gfneeds 1.0 needs")


# --- with the package index -----------------------------------------------------------------------------------
SLUG_CRAWLER = """\
import slugify

from node.crawler import BaseCrawler


class SlugCrawler(BaseCrawler):
    needs_browser = False

    def crawl(self):
        return [{"id": slugify.slugify("Grüße aus Köln"), "from": slugify.__file__}]
"""


@pytest.mark.slow
def test_crawl_with_a_pinned_package_from_the_index_that_gridfleet_does_not_have(tmp_path, monkeypatch, cli):
    """python-slugify (and text-unidecode, which it needs), pinned and fetched from the package index: the crawl
    imports them from their install under GRIDFLEET_HOME, whatever gridfleet's own environment holds; with
    text-unidecode left out, `validate` says so before anything is installed."""
    monkeypatch.setenv("GRIDFLEET_HOME", str(tmp_path / "home"))
    team = make_project(tmp_path / "conf" / "team")
    (team / "teamcrawlers" / "slug.py").write_text(SLUG_CRAWLER)
    (tmp_path / "conf" / "requirements.txt").write_text("python-slugify==8.0.4\n")
    config = tmp_path / "conf" / "fleet.yaml"
    config.write_text(
        textwrap.dedent(
            """\
            crawlers: {project: ./team, requirements: requirements.txt}
            sites:
              - {id: shop, start_url: 'http://a.test/', crawler: 'teamcrawlers.slug:SlugCrawler'}
            """
        )
    )
    code, out, err = cli("validate", "--config", str(config))
    if importlib.util.find_spec("text_unidecode") is None:  # the suite's environment is gridfleet's: as installed
        assert code == 2 and "python-slugify 8.0.4 needs text-unidecode>=1.3: neither" in err, err
        assert not (tmp_path / "home").exists()

    (tmp_path / "conf" / "requirements.txt").write_text("python-slugify==8.0.4\ntext-unidecode==1.3\n")
    code, out, err = cli("validate", "--config", str(config))
    assert code == 0 and "2 pins, each one's needs met" in out, err
    code, out, err = cli("crawl", "shop", "--config", str(config))
    assert code == 0, err
    [item] = [json.loads(line) for line in out.splitlines()]
    assert item["id"] == "grusse-aus-koln"
    assert Path(item["from"]).is_relative_to(requirements.requirements_root(tmp_path / "home")), item


def test_a_pip_that_does_not_end_in_its_time_is_one_line(monkeypatch):
    """pip is bounded: a run past PIP_TIMEOUT_S (here a millisecond, which no real pip meets) is a UsageError."""
    from cli.packaging import requirements
    from fleet.errors import UsageError

    monkeypatch.setattr(requirements, "PIP_TIMEOUT_S", 0.001)
    with pytest.raises(UsageError) as refused:
        requirements.pip(["--version"], "answer")
    assert str(refused.value) == "crawler project: pip could not answer: no end after 0.001 s"
