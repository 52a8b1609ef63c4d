"""Debian 12's index from this machine's real apt lists, and the twin's apt-get shim run for real with `sh`.

The shim asks the real `dpkg-query` of this machine what is installed; nothing is installed by these tests (the
package-file case runs a fake `dpkg` first on PATH: a seam, so that no test writes into this machine's dpkg).
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from twin.instance import debian
from twin.instance.debian import DebianIndexError, apt_get_shim, debian_targets, load_index, version_key, write_names

SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


@pytest.fixture(scope="module")
def index() -> debian.DebianIndex:
    return load_index()


@pytest.fixture(scope="module")
def shim(index: debian.DebianIndex, tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("apt shim")  # a space in the names file's path: the shim must quote it
    write_names(d / "debian names", index)
    path = d / "apt-get"
    path.write_text(apt_get_shim(str(d / "debian names")))
    return path


def run_shim(shim: Path, *args: str, cwd: Path | None = None, **env: str) -> subprocess.CompletedProcess[str]:
    env = {"PATH": SYSTEM_PATH, "LANG": "C.UTF-8", **env}
    return subprocess.run(["sh", str(shim), *args], capture_output=True, text=True, env=env, cwd=cwd, timeout=60)


def installed() -> set[str]:
    """The packages this machine has installed, as dpkg-query says."""
    out = subprocess.run(["dpkg-query", "-W", "-f=${Package} ${Status}\n"], capture_output=True, text=True)
    return {line.split()[0] for line in out.stdout.splitlines() if line.endswith(" install ok installed")}


# --- the index ----------------------------------------------------------------------------------------------------
def test_the_index_knows_what_debian_12_has_and_has_not(index: debian.DebianIndex) -> None:
    chromium = index.packages["chromium"]
    assert index.kind("chromium") == "package" and chromium.size > 10_000_000 and chromium.priority == "optional"
    assert "chromium-common" in chromium.depends
    assert index.packages["dpkg"].priority == "required" and index.packages["libc6"].pre_depends == ""
    for absent in ("amazon-ssm-agent", "amazon-efs-utils"):  # AWS's own packages: not in Debian 12
        assert index.kind(absent) == "missing"
    assert {"mawk", "gawk"} <= {p for p, _ in index.providers["awk"]} and index.kind("awk") == "virtual"
    assert ("default-jre-headless", "17") in index.providers["java-runtime-headless"]
    assert ("java-runtime-headless", "17") in index.packages["default-jre-headless"].provides
    assert index.kind("x-www-browser") == "referenced"  # named by packages, provided by none


def test_the_index_is_kept_while_the_lists_stay(index: debian.DebianIndex) -> None:
    assert load_index() is index


def test_version_key_orders_as_dpkg_does() -> None:
    pairs = [
        ("1.0~rc1", "1.0"),
        ("1:1.0", "2.0"),
        ("1.0-1", "1.0-1+deb12u1"),
        ("2.06-13+deb12u2", "2.06-13"),
        ("1.0a", "1.0+"),
        ("1.0", "1.0.0"),
        ("7.88.1-10+deb12u14", "7.88.1-10+deb12u5"),
        ("1.0~", "1.0~~"),
        ("2:1.17-74", "2:1.17-74"),
        ("0.33-1", "0.33"),
        ("1.2.3", "1.2.3-0"),
    ]
    for a, b in pairs:
        lt = subprocess.run(["dpkg", "--compare-versions", a, "lt", b]).returncode == 0
        eq = subprocess.run(["dpkg", "--compare-versions", a, "eq", b]).returncode == 0
        assert (version_key(a) < version_key(b), version_key(a) == version_key(b)) == (lt, eq), (a, b)


# --- which lists: Debian's own, from apt-get indextargets ---------------------------------------------------------
def target(path: Path, origin: str, codename: str, component: str = "main") -> str:
    return (
        f"Identifier: Packages\nFilename: {path}\nOrigin: {origin}\nCodename: {codename}\nRelease: {codename}\n"
        f"Component: {component}\nArchitecture: amd64\nRepo-URI: http://example.invalid/\n"
        f"Base-URI: http://example.invalid/dists/{codename}/\n"
    )


def packages_file(path: Path, *stanzas: tuple[str, str]) -> Path:
    path.write_text("".join(f"Package: {n}\nVersion: {v}\nArchitecture: amd64\nSize: 1\n\n" for n, v in stanzas))
    return path


def test_third_party_repositories_are_left_out(index: debian.DebianIndex, tmp_path: Path) -> None:
    real = subprocess.run(["apt-get", "indextargets"], capture_output=True, text=True, check=True).stdout
    fakes = [
        target(
            packages_file(tmp_path / "sdk", ("google-cloud-cli", "1.0"), ("chromium", "999")),
            "cloud-sdk",
            "cloud-sdk-bookworm",
        ),
        target(packages_file(tmp_path / "node", ("nodejs-nodesource", "20.0")), "Node Source", "nodistro"),
        target(packages_file(tmp_path / "bpo", ("backports-only", "1.0")), "Debian", "bookworm-backports"),
        target(packages_file(tmp_path / "contrib", ("contrib-only", "1.0")), "Debian", "bookworm", "contrib"),
    ]
    targets = debian_targets(real.rstrip("\n") + "\n\n" + "\n".join(fakes))
    assert sorted(t.release for t in targets) == sorted(debian.SUITES)
    third = load_index(targets)
    for name in ("google-cloud-cli", "nodejs-nodesource", "backports-only", "contrib-only"):
        assert third.kind(name) == "missing"
    assert third.packages["chromium"] == index.packages["chromium"]  # a third party's higher version is not seen


def test_missing_lists_say_to_run_apt_get_update(tmp_path: Path) -> None:
    main = target(packages_file(tmp_path / "main", ("a", "1")), "Debian", "bookworm")
    gone = target(tmp_path / "deleted", "Debian", "bookworm-updates")
    with pytest.raises(DebianIndexError, match=r"bookworm-updates, bookworm-security .*run `apt-get update`"):
        debian_targets(main + "\n" + gone)


def test_the_newest_version_wins_and_a_changed_list_is_read_again(tmp_path: Path) -> None:
    lists = {s: packages_file(tmp_path / s, ("pkg", "1.0-1")) for s in debian.SUITES}
    packages_file(lists["bookworm-security"], ("pkg", "1.0-1+deb12u1"), ("fix", "2"))
    targets = debian_targets("\n".join(target(p, "Debian", s) for s, p in lists.items()))
    assert load_index(targets).packages["pkg"].version == "1.0-1+deb12u1"
    packages_file(lists["bookworm-updates"], ("pkg", "1.0-2"))
    os.utime(lists["bookworm-updates"], ns=(1, 1))  # another mtime, as apt-get update leaves
    again = load_index(targets)
    assert again.packages["pkg"].version == "1.0-2" and again.kind("fix") == "package"


# --- the shim ------------------------------------------------------------------------------------------------------
def test_update_clean_and_autoclean_succeed(shim: Path) -> None:
    for cmd in ("update", "clean", "autoclean"):
        assert run_shim(shim, "-q", cmd).returncode == 0


def test_the_boot_scripts_install_succeeds_for_what_this_machine_has(shim: Path) -> None:
    wanted = debian.template_packages("_node_install.sh.j2")
    args = ["-o", "DPkg::Lock::Timeout=60", "install", "-y", "-q", "--no-install-recommends", *wanted]
    out = run_shim(shim, *args)
    if set(wanted) <= installed():  # `make setup` installs them
        assert out.returncode == 0, out.stderr
        assert "chromium is already the newest version (" in out.stdout
    else:
        assert out.returncode == 100 and "make setup" in out.stderr


def test_a_name_debian_has_not_fails_as_apt_does(shim: Path) -> None:
    out = run_shim(shim, "install", "-y", "amazon-ssm-agent", "amazon-efs-utils")
    assert out.returncode == 100
    assert out.stderr.splitlines() == [
        "E: Unable to locate package amazon-ssm-agent",
        "E: Unable to locate package amazon-efs-utils",
    ]


@pytest.mark.parametrize("name", ["awk", "java-runtime-headless", "amazon-ssm-agent", "x-www-browser", "no.such"])
def test_the_shim_answers_as_this_machines_apt(shim: Path, name: str) -> None:
    env = {"PATH": SYSTEM_PATH, "LANG": "C"}
    apt = subprocess.run(["apt-get", "-s", "install", name], capture_output=True, text=True, env=env)
    ours = run_shim(shim, "install", name)
    assert apt.returncode == ours.returncode == 100
    assert ours.stderr == apt.stderr
    progress = ("Reading ", "Building ")  # apt's progress lines, which the shim leaves out
    assert ours.stdout.splitlines() == [line for line in apt.stdout.splitlines() if not line.startswith(progress)]


def test_a_virtual_name_with_one_provider_is_that_provider(index: debian.DebianIndex, shim: Path) -> None:
    here = installed()
    name, provider = next(
        (v, p[0][0]) for v, p in index.providers.items() if len(p) == 1 and v not in index.packages and p[0][0] in here
    )
    out = run_shim(shim, "install", "-y", name)
    assert out.returncode == 0 and out.stdout.startswith(f"{provider} is already the newest version")


def test_a_name_debian_has_but_this_machine_has_not_installed_cannot_be_downloaded(
    index: debian.DebianIndex, shim: Path
) -> None:
    here = installed()
    name = next(n for n in ("hello", "cowsay", "sl", "0ad") if n in index.packages and n not in here)
    out = run_shim(shim, "install", "-y", "--no-install-recommends", name)
    assert out.returncode == 100
    assert f"the twin cannot download {name}" in out.stderr and "`make setup` installs" in out.stderr


def test_other_commands_are_refused(shim: Path) -> None:
    for args in (("upgrade",), ("remove", "chromium"), ()):
        out = run_shim(shim, *args)
        assert out.returncode == 100 and "does update, clean, autoclean and install" in out.stderr


# A seam: a fake dpkg first on PATH stands for the instance's own, which writes only into the instance's overlaid
# /usr and /var/lib there, but would write into this machine's here.
FAKE_DPKG = """#!/bin/sh
printf '%s\\n' "$@" > "$FAKE_DPKG_ARGS"
[ "$FAKE_DPKG_RC" = 0 ] && exit 0
echo "dpkg: dependency problems prevent configuration of fake-pkg:" >&2
exit "$FAKE_DPKG_RC"
"""


@pytest.mark.parametrize("rc", [0, 1])
def test_a_package_file_is_installed_with_dpkg(shim: Path, tmp_path: Path, rc: int) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "dpkg").write_text(FAKE_DPKG)
    (bin_dir / "dpkg").chmod(0o755)
    (tmp_path / "my pkg.deb").write_bytes(b"!<arch>\n")
    args = ("install", "-y", "-o", "Dpkg::Options::=--force-confold", "./my pkg.deb", "chromium")
    seen = tmp_path / "args"
    out = run_shim(
        shim, *args, cwd=tmp_path, PATH=f"{bin_dir}:{SYSTEM_PATH}", FAKE_DPKG_ARGS=str(seen), FAKE_DPKG_RC=str(rc)
    )
    assert seen.read_text().splitlines() == ["--install", "./my pkg.deb"]  # one argument, the option's value skipped
    if rc == 0:
        assert out.returncode == 0, out.stderr
    else:
        assert out.returncode == 100
        assert out.stderr.splitlines() == [
            "dpkg: dependency problems prevent configuration of fake-pkg:",
            "E: Sub-process /usr/bin/dpkg returned an error code (1)",
        ]


def test_a_missing_package_file_is_refused_before_dpkg(shim: Path, tmp_path: Path) -> None:
    out = run_shim(shim, "install", "-y", "./nope.deb", cwd=tmp_path)
    assert out.returncode == 100 and out.stderr == "E: Unsupported file ./nope.deb given on commandline\n"


def test_the_names_file_lives_in_the_instances_own_state() -> None:
    assert debian.NAMES_GUEST_PATH.startswith("/var/lib/cloud/")  # per instance in the twin (sandbox.py)
    assert f"names='{debian.NAMES_GUEST_PATH}'" in apt_get_shim()
