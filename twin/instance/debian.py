"""Debian 12 as a stock Debian 12 AMI sees it, from this machine's own apt lists: what the twin's `apt-get`
answers, and what a stock boot downloads from Debian's mirror.

A Debian 12 AMI's sources name main of bookworm, bookworm-updates and bookworm-security; this machine (Debian 12
too) has those lists and maybe third-party ones. `load_index()` finds the lists with `apt-get indextargets`, keeps
Debian's own, reads them with `apt-helper cat-file` and keeps what apt decides on: each package's candidate
version, Size, Priority, Depends, Pre-Depends and Provides, and the names packages only refer to (about a second;
kept per process while the lists' mtimes stay). The twin's instances have no network: `apt_get_shim()` is their
`apt-get`, answering from the names file (`write_names()`, at `NAMES_GUEST_PATH`) as apt on a Debian 12 instance
does, taking what this machine has installed as installed (`make setup` installs what boot scripts install), and
installing package files with the instance's own dpkg (the twin overlays /usr and /var/lib per instance).
`measure_boots()` asks real apt what stock boots fetch; `bench/boot_bytes.py` prints it, `cli/envs/nat.py` keeps it.
"""

from __future__ import annotations

import os
import re
import subprocess
import tempfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote

from twin.instance.cloud_config import TwinError

SUITES = ("bookworm", "bookworm-updates", "bookworm-security")
NAMES_GUEST_PATH = "/var/lib/cloud/twin/debian-names"  # the names file, inside an instance
APT_HELPER = "/usr/lib/apt/apt-helper"
TEMPLATES = Path(__file__).resolve().parents[2] / "cloud_init" / "templates"
_ENV = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8"}
_RELATIONS = ("Depends", "Pre-Depends", "Recommends", "Suggests", "Conflicts", "Breaks", "Replaces", "Enhances")
_FIELD = re.compile(rf"^(Package|Version|Size|Priority|Provides|{'|'.join(_RELATIONS)}): (.*)$", re.M)
_NAME = re.compile(r"(?:^|[,|])\s*([a-z0-9][a-z0-9+.-]*)")
_PROVIDE = re.compile(r"([a-z0-9][a-z0-9+.-]*)(?::\S+)?(?:\s*\(=\s*([^)\s]+)\s*\))?")

#: A stock Debian 12 EC2 image's packages, approximated (no manifest of the AMI is at hand): every package of
#: priority required or important (what debootstrap lays down), and what Debian's cloud image builds add for EC2
#: (their CLOUD, SYSTEM_BOOT and EC2 classes: cloud-init, openssh-server, sudo, chrony, a cloud kernel, ...), with
#: the dependencies apt picks without recommends. awscli, which some of those builds add, is left out: the node's
#: figure counts its download, so it errs high by that rather than low.
STOCK_IMAGE = tuple(
    """?priority(required) ?priority(important) cloud-init cloud-guest-utils cloud-initramfs-growroot amazon-ec2-utils
    openssh-server sudo chrony unattended-upgrades linux-image-cloud-amd64 grub-pc netplan.io systemd-resolved
    libpam-systemd polkitd apparmor zstd python3""".split()
)


class DebianIndexError(TwinError):
    """Debian's lists are missing or unreadable, or apt refused what it was asked."""


@dataclass(frozen=True)
class Target:
    """One Packages list apt has, as `apt-get indextargets` describes it."""

    filename: str
    repo_uri: str
    release: str
    component: str
    architecture: str
    base_uri: str


@dataclass(frozen=True)
class DebianPackage:
    """One package's candidate version, as its list describes it."""

    name: str
    version: str
    size: int  # bytes of its .deb
    priority: str
    depends: str
    pre_depends: str
    provides: tuple[tuple[str, str], ...]  # (virtual name, provided version or "")


@dataclass(frozen=True)
class DebianIndex:
    """Every name Debian 12 knows, as apt on a Debian 12 instance sees them."""

    packages: dict[str, DebianPackage]  # the candidate version of each real package
    providers: dict[str, tuple[tuple[str, str], ...]]  # virtual name -> (provider, provided version), apt's order
    referenced: dict[str, tuple[str, ...]]  # names only referred to -> the packages that replace them

    def kind(self, name: str) -> str:
        """What apt makes of a name: "package", "virtual", "referenced" or "missing"."""
        if name in self.packages:
            return "package"
        if name in self.providers:
            return "virtual"
        return "referenced" if name in self.referenced else "missing"


def _is_debian(r: dict[str, str]) -> bool:
    """Whether an index target is a Packages list of Debian 12's main, one a Debian 12 AMI's sources name."""
    kind = (r.get("Identifier"), r.get("Origin"), r.get("Codename") in SUITES, r.get("Component"))
    return kind == ("Packages", "Debian", True, "main") and Path(r.get("Filename", "")).is_file()


def debian_targets(indextargets: str | None = None) -> list[Target]:
    """Debian's own Packages lists among those apt has (`indextargets`: that command's output, else run it);
    DebianIndexError, naming `apt-get update`, when one of the three suites has none."""
    if indextargets is None:
        indextargets = _run(["apt-get", "indextargets"])
    records = [dict(re.findall(r"^([\w-]+): (.*)$", block, re.M)) for block in indextargets.split("\n\n")]
    debian = [r for r in records if _is_debian(r)]
    missing = [s for s in SUITES if s not in {r["Codename"] for r in debian}]
    if missing:
        raise DebianIndexError(
            f"this machine has no package list of Debian 12's {', '.join(missing)} (main): run `apt-get update`"
            " as root (`make setup` does)"
        )
    fields = ("Filename", "Repo-URI", "Release", "Component", "Architecture", "Base-URI")
    return [Target(*(r[f] for f in fields)) for r in debian]


def _run(argv: list[str]) -> str:
    try:
        done = subprocess.run(argv, capture_output=True, env=_ENV, timeout=300)
    except FileNotFoundError as e:
        raise DebianIndexError(f"{argv[0]} is missing: this is no Debian machine") from e
    if done.returncode != 0:
        err = done.stderr.decode(errors="replace").strip()[-800:]
        raise DebianIndexError(f"{' '.join(argv[:3])} ... failed ({done.returncode}): {err}")
    return done.stdout.decode(errors="replace")  # not text=True: its newline translation costs more than the parse


def version_key(version: str) -> tuple[object, ...]:
    """A sort key ordering Debian versions as dpkg does (epoch, then upstream and revision: runs of non-digits
    by character, `~` before the end and letters before other signs, runs of digits by value)."""
    epoch, _, rest = version.partition(":") if ":" in version else ("0", "", version)
    upstream, _, revision = rest.rpartition("-") if "-" in rest else (rest, "", "0")

    def part(s: str) -> tuple[object, ...]:
        order: list[object] = []
        for chars, digits in re.findall(r"(\D*)(\d*)", s):
            if chars or digits:  # a letter sorts before any other sign, "~" before all, even the end (0)
                weights = tuple(-1 if c == "~" else ord(c) + (0 if c.isalpha() else 256) for c in chars)
                order.append(((*weights, 0), int(digits or 0)))
        return (*order, ((0,), 0))  # what a shorter version is compared with past its end

    return (int(epoch or 0), part(upstream), part(revision))


def _package(f: dict[str, str]) -> DebianPackage:
    deps = (f.get("Depends", ""), f.get("Pre-Depends", ""))
    provides = tuple(_PROVIDE.findall(f.get("Provides", "")))
    return DebianPackage(f["Package"], f["Version"], int(f.get("Size", 0)), f.get("Priority", ""), *deps, provides)


def _parse(text: str, packages: dict[str, DebianPackage], seen: set[str], replaced: dict[str, set[str]]) -> None:
    relations: list[str] = []
    for block in text.split("\n\n"):
        fields = dict(_FIELD.findall(block))
        name = fields.get("Package")
        if name is None:
            continue
        old = packages.get(name)
        if old is None or version_key(fields["Version"]) > version_key(old.version):
            packages[name] = _package(fields)
        relations += [fields[r] for r in _RELATIONS if r in fields]
        for n in _NAME.findall(fields.get("Replaces", "")):
            replaced.setdefault(n, set()).add(name)
    seen.update(_NAME.findall(",".join(relations)))  # one pass over them all: much faster than one per field


_CACHE: dict[tuple[tuple[str, int, int], ...], DebianIndex] = {}


def load_index(targets: Sequence[Target] | None = None) -> DebianIndex:
    """Debian 12's packages from `targets` (default `debian_targets()`), kept while the lists' mtimes stay."""
    targets = debian_targets() if targets is None else targets
    key = tuple((t.filename, os.stat(t.filename).st_mtime_ns, os.stat(t.filename).st_size) for t in targets)
    if key not in _CACHE:
        packages: dict[str, DebianPackage] = {}
        seen: set[str] = set()
        replaced: dict[str, set[str]] = {}
        for t in targets:  # one file at a time: a list is ~50 MB uncompressed
            _parse(_run([APT_HELPER, "cat-file", t.filename]), packages, seen, replaced)
        providers: dict[str, list[tuple[str, str]]] = {}
        for pkg in sorted(packages.values(), key=lambda p: p.name, reverse=True):  # apt's order of providers
            for virtual, provided in pkg.provides:
                providers.setdefault(virtual, []).append((pkg.name, provided))
        referenced = {
            n: tuple(sorted((r for r in replaced.get(n, ()) if r in packages), reverse=True))
            for n in seen
            if n not in packages and n not in providers
        }
        _CACHE.clear()
        _CACHE[key] = DebianIndex(packages, {v: tuple(p) for v, p in providers.items()}, referenced)
    return _CACHE[key]


def names_text(index: DebianIndex) -> str:
    """The names file the shim reads: one tab-separated line per name: `NAME P` (a package), `NAME V PROVIDER...`
    (a virtual name; each provider as apt shows it, `name version[ (= provided)]`), `NAME R REPLACER...`."""
    lines = [f"{n}\tP" for n in index.packages]
    for virtual, provs in index.providers.items():
        if virtual not in index.packages:
            shown = [f"{p} {index.packages[p].version}" + (f" (= {v})" if v else "") for p, v in provs]
            lines.append("\t".join((virtual, "V", *shown)))
    lines += ["\t".join((n, "R", *repl)) for n, repl in index.referenced.items()]
    return "\n".join(lines) + "\n"


_written: dict[int, tuple[DebianIndex, str]] = {}  # id(index) -> (index, its names text): made once a process


def write_names(path: Path, index: DebianIndex | None = None) -> Path:
    """Write the names file at `path` (an instance's host side of `NAMES_GUEST_PATH`), readable by all."""
    index = index or load_index()
    if id(index) not in _written:  # the text of a few MB takes a second to make: each instance gets the same
        _written.clear()
        _written[id(index)] = (index, names_text(index))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(_written[id(index)][1])
    path.chmod(0o644)
    return path


_SHIM = r"""#!/bin/sh
# apt-get of the twin: Debian 12's answers, from the names the twin wrote; see twin/instance/debian.py.
set -f  # a name is never a file pattern
names=@NAMES@
cmd= pkgs= sim=0 err=0 n=$#
while [ "$n" -gt 0 ]; do
  a=$1; shift; n=$((n - 1))
  case $a in
    -o | -c | -t | --option | --config-file | --target-release | --default-release)
      [ "$n" -gt 0 ] && { shift; n=$((n - 1)); }; continue ;;
    -s | --simulate | --just-print | --dry-run | --recon | --no-act) sim=1; continue ;;
    -*) continue ;;
  esac
  if [ -z "$cmd" ]; then cmd=$a
  else case $a in */*.deb) set -- "$@" "$a" ;; *) pkgs="$pkgs $a" ;; esac  # "$@" keeps the package files
  fi
done
case $cmd in
  update | clean | autoclean) exit 0 ;;
  install) ;;
  *) echo "E: the twin's apt-get does update, clean, autoclean and install, not: $cmd" >&2; exit 100 ;;
esac
for f in "$@"; do [ -f "$f" ] || { echo "E: Unsupported file $f given on commandline" >&2; exit 100; }; done
[ -r "$names" ] || { echo "E: the twin wrote no list of Debian's packages at $names" >&2; exit 100; }
found=$(awk -F '\t' -v want=" $pkgs " 'index(want, " " $1 " ") || index(want, " " $1 ":")' "$names")
want=
for p in $pkgs; do
  case $p in *=* | */*) echo "E: the twin's apt-get installs by name, not: $p" >&2; err=1; continue ;; esac
  line=$(printf '%s\n' "$found" | awk -F '\t' -v n="${p%%:*}" '$1 == n')
  case $(printf '%s' "$line" | cut -f2) in
    P) want="$want ${p%%:*}" ;;
    V) if [ "$(printf '%s' "$line" | awk -F '\t' '{print NF}')" = 3 ]; then
         q=$(printf '%s' "$line" | cut -f3 | cut -d' ' -f1)  # apt takes the one provider, silently
         want="$want $q"
       else
         echo "Package $p is a virtual package provided by:"
         printf '%s\n' "$line" | cut -f3- | tr '\t' '\n' | sed 's/^/  /'; echo
         echo "E: Package '$p' has no installation candidate" >&2; err=1
       fi ;;
    R) echo "Package $p is not available, but is referred to by another package."
       echo "This may mean that the package is missing, has been obsoleted, or"
       echo "is only available from another source"
       r=$(printf '%s' "$line" | cut -f3- -s | tr '\t' ' ')
       [ -z "$r" ] || printf 'However the following packages replace it:\n  %s\n' "$r"; echo
       echo "E: Package '$p' has no installation candidate" >&2; err=1 ;;
    *) echo "E: Unable to locate package $p" >&2; err=1
       case $p in *[].?+*\|\[^\$]*)
         echo "E: Couldn't find any package by glob '$p'" >&2; echo "E: Couldn't find any package by regex '$p'" >&2 ;;
       esac ;;
  esac
done
[ "$err" = 0 ] || exit 100
for p in $want; do
  [ "$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null)" = "install ok installed" ] && continue
  echo "E: the twin cannot download $p from Debian's mirror (an instance has no network):" \
    "\`make setup\` installs what boot scripts install" >&2
  err=1
done
[ "$err" = 0 ] || exit 100
for p in $want; do echo "$p is already the newest version ($(dpkg-query -W -f='${Version}' "$p"))."; done
[ $# -gt 0 ] && [ "$sim" = 0 ] || exit 0
dpkg --install "$@"; rc=$?
[ "$rc" = 0 ] && exit 0
echo "E: Sub-process /usr/bin/dpkg returned an error code ($rc)" >&2  # apt's words when dpkg fails
exit 100
"""


def apt_get_shim(names_path: str = NAMES_GUEST_PATH) -> str:
    """The twin's `apt-get` (POSIX sh, run inside an instance), reading the names file at `names_path`."""
    return _SHIM.replace("@NAMES@", "'" + names_path.replace("'", "'\\''") + "'")


@dataclass(frozen=True)
class Fetch:
    """What one `apt-get install` would download: its package files, and the sum of their Sizes."""

    files: tuple[str, ...]
    bytes: int


@dataclass(frozen=True)
class BootBytes:
    """What boots fetch from Debian's mirror, measured with real apt by `measure_boots()`."""

    node: Fetch  # a stock node boot: the node's APT_PACKAGES onto the stock image
    hub: Fetch  # a stock hub boot
    baked_node: Fetch  # a node boot on the baked image (the stock image and the node's packages)
    apt_update_bytes: int  # the `apt-get update` before a stock boot installs (an image's lists are emptied)
    image_packages: int  # how many packages the synthesized stock image has


def template_packages(template: str) -> tuple[str, ...]:
    """The APT_PACKAGES a boot template installs (`_node_install.sh.j2`, `hub-boot.sh.j2`)."""
    m = re.search(r"^APT_PACKAGES=\(([^)]*)\)", (TEMPLATES / template).read_text(), re.M)
    if m is None:
        raise DebianIndexError(f"{TEMPLATES / template} sets no APT_PACKAGES")
    return tuple(m.group(1).split())


class _Apt:
    """Real apt on Debian's lists alone and a status file of its own: nothing of this machine's installed
    packages, sources, pins or downloaded package files counts, and nothing of it is written."""

    def __init__(self, work: Path, targets: Sequence[Target]) -> None:
        lines = [f"deb [arch={t.architecture}] {t.repo_uri} {t.release} {t.component}\n" for t in targets]
        (work / "sources.list").write_text("".join(lines))
        for d in ("parts", "prefs", "cache/archives/partial"):
            (work / d).mkdir(parents=True)
        self.status = work / "status"
        self.status.write_text("")
        (work / "extended_states").write_text("")
        self.opts = [
            f"-oDir::State::status={self.status}", f"-oDir::State::extended_states={work / 'extended_states'}",
            f"-oDir::Etc::SourceList={work / 'sources.list'}", f"-oDir::Etc::SourceParts={work / 'parts'}",
            f"-oDir::Etc::Preferences={work / 'prefs' / 'none'}", f"-oDir::Etc::PreferencesParts={work / 'prefs'}",
            f"-oDir::Cache={work / 'cache'}", "-oDebug::NoLocking=true",
        ]  # fmt: skip

    def run(self, tool: str, *args: str) -> str:
        return _run([tool, *self.opts, *args])

    def resolve(self, names: Iterable[str]) -> list[tuple[str, str]]:
        """(name, version) of each package `apt-get install --no-install-recommends NAMES` would install."""
        out = self.run("apt-get", "-s", "-q", "install", "--no-install-recommends", *names)
        return re.findall(r"^Inst (\S+) (?:\[\S+\] )?\((\S+) ", out, re.M)

    def mark_installed(self, pkgs: Iterable[tuple[str, str]]) -> None:
        """Record packages in the status file as dpkg records installed ones (their records from the lists,
        `Status: install ok installed`); `apt-get check` then has to accept it."""
        shown = self.run("apt-cache", "show", *(f"{n}={v}" for n, v in pkgs))
        installed = r"\1\nStatus: install ok installed"
        with self.status.open("a") as f:  # apt-cache shows one record per package asked
            f.writelines(re.sub(r"^(Package: .*)$", installed, s.strip("\n"), count=1, flags=re.M) + "\n\n"
                         for s in shown.split("\n\n") if s.strip())  # fmt: skip
        self.run("apt-get", "check", "-q")

    def fetch(self, names: Iterable[str]) -> Fetch:
        """What `apt-get install --no-install-recommends NAMES` would download (`--print-uris`)."""
        out = self.run("apt-get", "install", "--print-uris", "-qq", "-y", "--no-install-recommends", *names)
        files = re.findall(r"^'\S+' (\S+\.deb) (\d+) ", out, re.M)
        return Fetch(tuple(f for f, _ in files), sum(int(n) for _, n in files))


def apt_update_bytes(targets: Sequence[Target]) -> int:
    """What `apt-get update` fetches on a stock image: each suite's InRelease and, as that lists them, its Packages
    and English Translation of main in the compression apt asks for first (xz)."""
    total = 0
    for t in targets:
        name = re.sub(r"^\w+://", "", t.base_uri).replace("/", "_") + "InRelease"  # apt's name for it in its lists
        release = Path(t.filename).with_name(name)
        if not release.is_file():
            raise DebianIndexError(f"{release} is missing: run `apt-get update` as root")
        text = release.read_text(errors="replace")
        total += release.stat().st_size
        for path in (f"{t.component}/binary-{t.architecture}/Packages.xz", f"{t.component}/i18n/Translation-en.xz"):
            m = re.search(rf"^ \S+ +(\d+) {re.escape(path)}$", text, re.M)
            total += int(m.group(1)) if m else 0
    return total


def measure_boots(targets: Sequence[Target] | None = None) -> BootBytes:
    """What stock boots fetch from Debian's mirror, asked of real apt: the stock image (`STOCK_IMAGE`, resolved by
    apt onto an empty status) written as a status file, then the node's and the hub's APT_PACKAGES installed onto
    it with `--print-uris`; the baked node image is that status with the node's packages added."""
    targets = debian_targets() if targets is None else targets
    node, hub = template_packages("_node_install.sh.j2"), template_packages("hub-boot.sh.j2")
    with tempfile.TemporaryDirectory(prefix="gridfleet-apt-") as tmp:
        apt = _Apt(Path(tmp), targets)
        image = apt.resolve(STOCK_IMAGE)
        apt.mark_installed(image)
        node_fetch, hub_fetch = apt.fetch(node), apt.fetch(hub)
        apt.mark_installed((f.split("_")[0], unquote(f.split("_")[1])) for f in node_fetch.files)
        baked = apt.fetch(node)
    return BootBytes(node_fetch, hub_fetch, baked, apt_update_bytes(targets), len(image))
