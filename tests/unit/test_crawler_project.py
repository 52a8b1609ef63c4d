"""The crawler project fleet.yaml names: found relative to the config, identified by name, version and content
hash, its crawlers checked inside it (and nowhere else on the import path), its requirements pinned."""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

import pytest

from cli.main import main
from cli.packaging.crawler_ship import build_wheel, install_local, installed_config, project_of
from cli.packaging.requirements import dists_in, pinned, unmet
from fleet.config.bundle import bundle_mismatch
from fleet.config.load import dump_config, load_config, parse_config
from fleet.crawl.project import MAX_FILES, CrawlerProject, ProjectError, content_hash, shipped_files
from fleet.errors import ConfigError, UsageError
from tests.helpers.crawler_project import CRAWLER, make_project

SITES = """\
sites:
  - {id: shop, start_url: "https://shop.example/", crawler: "%s"}
"""


def config_file(tmp_path, crawler=CRAWLER, crawlers="crawlers: {project: ./team}\n"):
    path = tmp_path / "conf" / "fleet.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(crawlers + SITES % crawler)
    return path


def test_a_project_beside_the_config_is_found_and_its_crawler_resolves_inside_it(tmp_path):
    make_project(tmp_path / "conf" / "team")
    config = load_config(config_file(tmp_path))
    assert config.crawlers is not None and config.crawlers.project == str((tmp_path / "conf" / "team").resolve())
    project = project_of(config)
    assert project is not None and (project.build.name, project.build.version) == ("teamcrawlers", "1.0.0")
    assert project.build.hash.startswith("sha256:") and len(project.build.hash) == 71


def test_a_crawler_outside_the_project_is_refused_even_when_it_is_importable(tmp_path):
    make_project(tmp_path / "conf" / "team")
    with pytest.raises(ConfigError) as e:
        load_config(config_file(tmp_path, crawler="yaml.loader:SafeLoader"))  # installed, not the team's
    assert "sites[0].crawler" in str(e.value) and "is not in the crawler project" in str(e.value)
    # gridfleet's own crawlers still resolve by their dotted path
    assert load_config(config_file(tmp_path, crawler="node.crawlers.links:LinksCrawler")).sites[0].crawler


def test_a_missing_project_is_one_error_at_its_line_not_one_per_site(tmp_path):
    with pytest.raises(ConfigError) as e:
        load_config(config_file(tmp_path))
    text = str(e.value)
    assert "crawlers.project" in text and "no such directory" in text and ":1" in text
    assert "sites[0]" not in text


def test_a_directory_that_is_no_project_says_so(tmp_path):
    (tmp_path / "conf" / "team").mkdir(parents=True)
    with pytest.raises(ConfigError, match="neither a pyproject.toml nor an __init__.py"):
        load_config(config_file(tmp_path))


def test_a_plain_package_directory_is_a_project_named_by_the_directory(tmp_path):
    pkg = tmp_path / "conf" / "mycrawlers"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "shop.py").write_text("class Shop:\n    pass\n")
    config = load_config(config_file(tmp_path, "mycrawlers.shop:Shop", "crawlers: {project: mycrawlers}\n"))
    project = project_of(config)
    assert project is not None and (project.kind, project.build.name, project.build.version) == (
        "package",
        "mycrawlers",
        "0",
    )
    with pytest.raises(ConfigError, match="defines no 'Nope'"):
        load_config(config_file(tmp_path, "mycrawlers.shop:Nope", "crawlers: {project: mycrawlers}\n"))


def test_the_hash_follows_the_content_not_caches_or_the_place(tmp_path):
    a, b = make_project(tmp_path / "a"), make_project(tmp_path / "b")
    assert content_hash(a) == content_hash(b)
    (a / "teamcrawlers" / "__pycache__").mkdir()
    (a / "teamcrawlers" / "__pycache__" / "shop.cpython-311.pyc").write_bytes(b"\0cache")
    assert content_hash(a) == content_hash(b)
    make_project(b, release="r2")
    assert content_hash(a) != content_hash(b)


def test_the_walk_of_a_huge_directory_is_bounded(tmp_path):
    root = make_project(tmp_path / "big")
    for i in range(MAX_FILES + 1):
        (root / f"f{i}.txt").write_text("")
    with pytest.raises(ProjectError, match="not a crawler project"):
        CrawlerProject.at(root)


def test_a_project_without_a_static_version_is_refused(tmp_path):
    root = make_project(tmp_path / "p")
    (root / "pyproject.toml").write_text('[project]\nname = "teamcrawlers"\ndynamic = ["version"]\n')
    with pytest.raises(ProjectError, match="version must be a string"):
        CrawlerProject.at(root)


def test_the_config_the_hub_and_nodes_get_names_the_project_by_its_identity(tmp_path, monkeypatch):
    make_project(tmp_path / "conf" / "team")
    config = load_config(config_file(tmp_path))
    project = project_of(config)
    assert project is not None
    given = installed_config(config, project)
    assert given.crawlers is not None and given.crawlers.project is None
    assert given.crawlers.installed is not None and given.crawlers.installed.hash == project.build.hash
    # read back where the project's directory does not exist (an instance): the crawler must be installed
    with pytest.raises(ConfigError, match="'teamcrawlers.shop' cannot be imported"):
        parse_config(dump_config(given), "run.yaml", tmp_path / "elsewhere")
    monkeypatch.syspath_prepend(str(tmp_path / "conf" / "team"))  # as the bundle or the local stack installs it
    again = parse_config(dump_config(given), "run.yaml", tmp_path / "elsewhere")
    assert again.crawlers == given.crawlers


def test_requirements_must_be_pinned(tmp_path):
    req = tmp_path / "requirements.txt"
    req.write_text("# what the crawlers need\nlxml==6.0.2\n\nparsel==1.10.0  # selectors\n")
    assert pinned(str(req)) == ["lxml==6.0.2", "parsel==1.10.0"]
    req.write_text("lxml>=5\n")
    with pytest.raises(UsageError, match=r"requirements.txt:1: 'lxml>=5' is not pinned"):
        pinned(str(req))


def test_a_requirement_neither_gridfleet_nor_the_pins_provide_is_named(tmp_path):
    site = tmp_path / "site"
    info = site / "teamcrawlers-1.0.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: teamcrawlers\nVersion: 1.0.0\n"
        "Requires-Dist: selenium>=4\nRequires-Dist: no-such-dist-gf==1.0\n"
        'Requires-Dist: other-gf; extra == "dev"\n'
    )
    assert unmet(dists_in(site)) == ["teamcrawlers 1.0.0 needs no-such-dist-gf==1.0"]  # selenium: gridfleet's


def test_a_node_refuses_a_bundle_whose_crawler_project_is_not_the_runs(tmp_path):
    make_project(tmp_path / "conf" / "team")
    config = load_config(config_file(tmp_path))
    project = project_of(config)
    assert project is not None
    given = installed_config(config, project)
    install = tmp_path / "opt"
    assert bundle_mismatch(given, install) is None  # no bundle here: the embedded default
    (install / "wheels").mkdir(parents=True)
    assert "has no crawler project" in (bundle_mismatch(given, install) or "")
    (install / "crawlers.json").write_text(json.dumps(project.build.as_dict()))
    assert bundle_mismatch(given, install) is None
    (install / "crawlers.json").write_text(json.dumps({**project.build.as_dict(), "hash": "sha256:" + "0" * 64}))
    assert "build and upload the bundle again" in (bundle_mismatch(given, install) or "")
    assert bundle_mismatch(config.model_copy(update={"crawlers": None}), install) is None


def test_the_hubs_config_keeps_the_webhook_the_nodes_copy_does_not(tmp_path):
    make_project(tmp_path / "conf" / "team")
    hook = "https://hooks.example/services/T0/B0/secret"
    config = load_config(
        config_file(tmp_path, crawlers=f"crawlers: {{project: ./team}}\nnotify: {{webhook_url: '{hook}'}}\n")
    )
    project = project_of(config)
    assert project is not None
    given = installed_config(config, project)
    assert hook in dump_config(given, secrets=True) and hook not in dump_config(given)


def test_unpinned_requirements_are_refused_when_the_config_loads_before_anything_starts(tmp_path):
    make_project(tmp_path / "conf" / "team")
    (tmp_path / "conf" / "requirements.txt").write_text("lxml>=5\n")
    crawlers = "crawlers: {project: ./team, requirements: requirements.txt}\n"
    with pytest.raises(ConfigError) as e:
        load_config(config_file(tmp_path, crawlers=crawlers))
    assert "crawlers.requirements" in str(e.value) and "'lxml>=5' is not pinned" in str(e.value)
    (tmp_path / "conf" / "requirements.txt").write_text("x==1\n" * 1001)
    with pytest.raises(ConfigError, match="more than 1000 lines"):
        load_config(config_file(tmp_path, crawlers=crawlers))


def plain_package(root):
    """A plain package directory with a subpackage, and the folders a team's checkout holds beside its code."""
    (root / "sub").mkdir(parents=True)
    (root / "__init__.py").write_text("")
    (root / "shop.py").write_text("class Shop:\n    pass\n")
    (root / "sub" / "__init__.py").write_text("")
    (root / "sub" / "util.py").write_text("X = 1\n")
    for skipped in ("build", "dist", "venv", "node_modules", "sub/__pycache__"):
        (root / skipped).mkdir()
        (root / skipped / "mod.py").write_text("X = 'not shipped'\n")
    return root


def files_under(root):
    return {p.relative_to(root) for p in root.rglob("*") if p.is_file()}


def test_the_files_hashed_are_the_files_installed_for_the_local_nodes(tmp_path):
    root = plain_package(tmp_path / "mycrawlers")
    (root / "alias.py").symlink_to("shop.py")  # a link inside the project ships as the file
    project = CrawlerProject.at(root)
    target = install_local(project, tmp_path / "installed")
    installed = files_under(target / "mycrawlers")
    assert installed == set(shipped_files(root))
    assert Path("sub/util.py") in installed and Path("alias.py") in installed
    assert not {p for p in installed if p.parts[0] in ("build", "dist", "venv", "node_modules")}
    assert (target / "mycrawlers" / "alias.py").read_text() == "class Shop:\n    pass\n"
    # what the hash leaves out does not ship: a project differing there is the same code, installed once
    (root / "build" / "mod.py").write_text("X = 'changed'\n")
    assert CrawlerProject.at(root).build == project.build


def test_a_change_to_any_shipped_file_changes_the_hash(tmp_path):
    root = plain_package(tmp_path / "mycrawlers")
    (root / "data").mkdir()
    (root / "data" / "real.txt").write_text("one\n")
    (root / "alias.txt").symlink_to("data/real.txt")
    seen = {content_hash(root)}
    for path, text in (("sub/util.py", "X = 2\n"), ("data/real.txt", "two\n"), ("shop.py", "")):
        (root / path).write_text(text)
        seen.add(content_hash(root))
    (root / "sub" / "new.py").write_text("")
    seen.add(content_hash(root))
    assert len(seen) == 5
    # a link into a folder the walk skips ships its target's content: a change there is a change of the hash
    (root / "generated.py").symlink_to("build/mod.py")
    before = content_hash(root)
    (root / "build" / "mod.py").write_text("X = 'regenerated'\n")
    assert content_hash(root) != before


@pytest.mark.parametrize(
    ("link", "target", "said"),
    [
        ("teamcrawlers/passwd.txt", "/etc/passwd", "a symbolic link to /etc/passwd, outside the crawler project"),
        ("teamcrawlers/etc", "/etc", "a symbolic link to /etc, outside the crawler project"),
        ("teamcrawlers/more", ".", "a symbolic link to a directory"),
        ("teamcrawlers/gone.py", "nowhere.py", "a symbolic link to nothing"),
    ],
)
def test_a_link_that_would_ship_anything_but_a_file_of_the_project_is_refused_in_one_line(
    tmp_path, monkeypatch, capsys, link, target, said
):
    root = make_project(tmp_path / "conf" / "team")
    (root / link).symlink_to(target)
    with pytest.raises(ProjectError, match=f"^{root / link}: {said}"):
        CrawlerProject.at(root)
    monkeypatch.setenv("GRIDFLEET_HOME", str(tmp_path / "home"))
    assert main(["validate", "--config", str(config_file(tmp_path))]) == 2
    out, err = capsys.readouterr()
    assert out == "" and len(err.splitlines()) == 1, err
    assert "crawlers.project" in err and f"{root / link}: {said}" in err and "Traceback" not in err
    assert not (tmp_path / "home").exists()


@pytest.mark.slow
def test_the_wheel_holds_only_files_the_hash_covers(tmp_path):
    root = make_project(tmp_path / "team")
    (root / "shared").mkdir()
    (root / "shared" / "helpers.py").write_text("HELP = 1\n")
    (root / "teamcrawlers" / "helpers.py").symlink_to("../shared/helpers.py")
    (root / "build" / "lib" / "teamcrawlers").mkdir(parents=True)  # an old build's leftovers
    (root / "build" / "lib" / "teamcrawlers" / "stale.py").write_text("STALE = 1\n")
    project = CrawlerProject.at(root)
    wheel = build_wheel(project, tmp_path / "wheels")
    with zipfile.ZipFile(wheel) as z:
        packed = {n: z.read(n) for n in z.namelist() if ".dist-info/" not in n}
    hashed = {rel.as_posix(): (root / rel).read_bytes() for rel in shipped_files(root)}
    assert packed == {n: hashed[n] for n in hashed if n.startswith("teamcrawlers/")}
    assert "teamcrawlers/helpers.py" in packed


def test_a_run_config_read_on_the_operators_machine_finds_its_crawlers_in_the_stacks_installed_copy(tmp_path):
    """`status` or `check` beside a running local stack read the run's config, which names the project by its
    identity: its crawlers are found in the stack's copy (not on the command's own import path)."""
    make_project(tmp_path / "conf" / "team")
    config = load_config(config_file(tmp_path))
    project = project_of(config)
    assert project is not None
    installed = tmp_path / "stack" / "crawlers"
    install_local(project, installed)
    run_yaml = tmp_path / "stack" / "runs" / "r1" / "fleet.yaml"
    run_yaml.parent.mkdir(parents=True)
    run_yaml.write_text(dump_config(installed_config(config, project)))
    with pytest.raises(ConfigError, match="'teamcrawlers.shop' cannot be imported"):
        load_config(run_yaml)  # the copy is not on this process's import path
    again = load_config(run_yaml, installed_root=installed)
    assert again.sites[0].crawler == config.sites[0].crawler
    with pytest.raises(ConfigError, match="is not in the crawler project"):
        load_config(run_yaml, installed_root=tmp_path / "nowhere")  # another stack's copy does not stand in
