"""What a run's config asks of the code bundle: the platform its wheels are built for, and the crawler project it
installs. `gridfleet bundle` builds to the first; a node checks the second at boot, so that a run started after
the project changed, without a new bundle, does not crawl with old code.
"""

from __future__ import annotations

from pathlib import Path

from fleet.config import Config
from fleet.config.crawlers import InstalledCrawlers
from fleet.platform import BundlePlatform, fleet_arch, uname_machine


def platform_of(config: Config) -> BundlePlatform:
    """The platform of the fleet's instances: the instance types' architecture and the image's Python."""
    return BundlePlatform(uname_machine(fleet_arch(config.fleet.instance_types)), config.aws.image_python)


#: What the bundle says of the crawler project it installed, in the install directory.
BUNDLE_MANIFEST = "crawlers.json"


def bundle_mismatch(config: Config, install_dir: Path) -> str | None:
    """Why the crawler project the bundle installed is not the one the config names (None: it is, or neither
    names one). A run started after the project changed, without a new bundle, would crawl with old code."""
    section = config.crawlers
    wanted = section.installed if section is not None else None
    path = install_dir / BUNDLE_MANIFEST
    try:
        text = path.read_text(encoding="utf-8")[:4096] if path.is_file() else None
    except OSError:
        text = None
    if wanted is None:
        return None
    if text is None:
        if not (install_dir / "wheels").is_dir():
            return None  # not where a bundle was installed (the embedded default)
        return (
            f"the bundle in {install_dir} has no crawler project, the run's config names {wanted.name} "
            f"{wanted.version}: build the bundle with that config (gridfleet bundle --config ... --upload)"
        )
    try:
        have = InstalledCrawlers.model_validate_json(text)
    except ValueError:
        return f"{path}: not a crawler project manifest"
    if have.hash == wanted.hash:
        return None
    return (
        f"the bundle installed the crawler project {have.name} {have.version} ({have.hash[:19]}), the run's config "
        f"names {wanted.name} {wanted.version} ({wanted.hash[:19]}): build and upload the bundle again "
        "(gridfleet bundle --config ... --upload)"
    )
