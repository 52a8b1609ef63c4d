"""A bundle built before, uploaded as it is: `gridfleet bundle --upload --built DIR`.

An operator who bakes a node image builds the bundle once (`gridfleet bundle --out DIR`), bakes that file, applies
Terraform, then uploads the same bytes, so the image's dependency set and the uploaded bundle's are one build.
What DIR holds is checked against what this gridfleet would build for the config: its gridfleet version, the
instances' platform, and the crawler project (or none). Nothing in DIR is trusted further than that: the files are
read with a size bound, and a mismatch is one line naming the file and what differs.
"""

from __future__ import annotations

import json
import re
import tarfile
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from cli.packaging.crawler_ship import CrawlerShipment
from fleet.errors import UsageError
from fleet.platform import PLATFORM_FILE, BundlePlatform

BUNDLE = "gridfleet-bundle.tar.gz"
LAMBDA_ZIP = "gridfleet-lambda.zip"
#: platform.json and crawlers.json are a few hundred bytes; anything past this is not what `gridfleet bundle` wrote.
MEMBER_MAX_BYTES = 64 * 1024
_OWN_WHEEL = re.compile(r"wheels/gridfleet-([^-/]+)-py3-none-any\.whl")


@dataclass(frozen=True)
class Built:
    bundle: Path
    lambda_zip: Path


def gridfleet_version() -> str:
    return metadata.version("gridfleet")


def check_built(out: Path, target: BundlePlatform, crawlers: CrawlerShipment | None) -> Built:
    """The bundle and the Lambda package in `out`, once they are what `gridfleet bundle` builds for this config
    now; UsageError naming the file and the difference otherwise."""
    bundle, zipped = out / BUNDLE, out / LAMBDA_ZIP
    for path in (bundle, zipped):
        if not path.is_file():
            raise UsageError(f"--built {out}: no {path.name} there (build it with `gridfleet bundle --out {out}`)")
    try:
        with tarfile.open(bundle, "r:gz") as tar:
            names = tar.getnames()
            platform = _member(tar, PLATFORM_FILE)
            manifest = _member(tar, "crawlers.json")
    except (OSError, tarfile.TarError, EOFError) as e:
        raise UsageError(f"--built {bundle}: not a bundle ({e})") from None
    versions = [m.group(1) for m in map(_OWN_WHEEL.fullmatch, names) if m]
    if versions != [gridfleet_version()]:
        found = ", ".join(versions) or "none"
        raise UsageError(f"--built {bundle}: holds gridfleet {found}, this is gridfleet {gridfleet_version()}")
    try:
        built_for = BundlePlatform.from_json(platform or b"")
    except ValueError as e:
        raise UsageError(f"--built {bundle}: {PLATFORM_FILE}: {e}") from None
    if built_for != target:
        raise UsageError(f"--built {bundle}: built for {built_for.describe()}, the instances are {target.describe()}")
    _check_crawlers(bundle, manifest, crawlers)
    return Built(bundle, zipped)


def _member(tar: tarfile.TarFile, name: str) -> bytes | None:
    try:
        info = tar.getmember(name)
    except KeyError:
        return None
    if not info.isfile() or info.size > MEMBER_MAX_BYTES:
        raise UsageError(f"--built: {name} in the bundle is not a small file")
    f = tar.extractfile(info)
    return f.read(MEMBER_MAX_BYTES) if f is not None else None


def _check_crawlers(bundle: Path, manifest: bytes | None, crawlers: CrawlerShipment | None) -> None:
    want = crawlers.project.build.as_dict() if crawlers is not None else None
    try:
        have = json.loads(manifest) if manifest is not None else None
    except ValueError:
        raise UsageError(f"--built {bundle}: crawlers.json is not JSON") from None
    if have == want:
        return
    name = lambda d: f"{d.get('name')} {d.get('version')} ({d.get('hash')})" if isinstance(d, dict) else "none"  # noqa: E731
    raise UsageError(f"--built {bundle}: holds the crawler project {name(have)}, the config ships {name(want)}")
