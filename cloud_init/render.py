"""Render the cloud-init user-data of gridfleet's hub and node instances.

`render_node` and `render_hub` are pure functions: they read their templates
(``cloud_init/templates``) and return a ``#cloud-config`` document, nothing
else. The document writes a boot script and a small env file with
``write_files`` and runs the script with ``runcmd``; the script does the work
(packages, EFS, the bundle, the agent or the hub) so that retries, time limits
and failure reporting are under its control.

Values reach the output in exactly two ways: through ``shquote`` (``shlex.quote``)
wherever they land in a shell line, and through ``tojson`` wherever they land in
YAML (JSON is YAML). The parameters are validated when the dataclasses are
built, so a bad value fails with a `RenderError` naming its field before
anything is rendered. User-data never carries secrets: instances use their IAM
instance profile, and the Grid's secret travels through SSM Parameter Store, the
user-data naming only its parameter.
"""

from __future__ import annotations

import base64
import dataclasses
import gzip
import json
import posixpath
import re
import shlex
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import jinja2
import yaml

#: EC2's limit on raw (not base64-encoded) user-data, in bytes.
USER_DATA_LIMIT = 16384

TEMPLATES_DIR = Path(__file__).parent / "templates"

NODE_BOOT_SCRIPT = "/usr/local/sbin/gridfleet-node-boot"
NODE_ENV_FILE = "/etc/gridfleet/node.env"
HUB_BOOT_SCRIPT = "/usr/local/sbin/gridfleet-hub-boot"
HUB_ENV_FILE = "/etc/gridfleet/hub.env"
NODE_AGENT_LOG = "/var/log/gridfleet-node.log"  # gridfleet-node.service's output

SELF_STOP_CHOICES = ("shutdown", "terminate", "none")

# _REGION_RE, _EFS_ID_RE and _HOST_RE copy the rules the config is loaded by (fleet.config.aws.USER_DATA_RULES: a
# test holds each copy to its rule), so `validate` refuses what is refused here; here they are the last check.
_RUN_ID_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")  # the same rule as `gridfleet run --run-id`
_EFS_ID_RE = re.compile(r"fs-[0-9a-f]{8,40}")
_REGION_RE = re.compile(r"[a-z]{2}(-[a-z]+)+-[0-9]+")
_BUCKET_RE = re.compile(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]")
_HOST_RE = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9.-]{0,251}[A-Za-z0-9])?")  # a DNS name or an IPv4 address
_IMDS_URL_RE = re.compile(r"https?://(?:[A-Za-z0-9.-]+|\[[0-9A-Fa-f:.]+\])(?::[0-9]{1,5})?")
_PATH_RE = re.compile(r"(?:/[A-Za-z0-9._+@-]+)+")
_USER_RE = re.compile(r"[a-z_][a-z0-9_-]{0,31}")  # the rule of fleet.crawl_user (and of useradd's default)
_CRAWL_UID_MIN, _CRAWL_UID_MAX = 1000, 60000  # fleet.crawl_uid: a regular user's id, never root's
_S3_KEY_MAX = 1024
_TABLE_RE = re.compile(r"[A-Za-z0-9_.-]{3,255}")  # DynamoDB's rule for table names
_LOG_GROUP_RE = re.compile(r"[A-Za-z0-9_./#-]{1,512}")  # CloudWatch Logs' rule for group names
# An SSM parameter's name, as a path: the Grid secret's is /<stack>/grid-secret (fleet.config.aws).
_PARAMETER_RE = re.compile(r"(?:/[A-Za-z0-9_.-]{1,128}){1,15}")
_KMS_ALIAS_RE = re.compile(r"alias/[A-Za-z0-9/_-]{1,250}")  # a KMS key by its alias


class RenderError(ValueError):
    """A parameter of the user-data is invalid, or the rendered user-data is too large."""

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(f"{field}: {problem}")
        self.field = field


# --- validation ---------------------------------------------------------------------------------
_QUOTE_KEEP = 64


def _quote(value: object, keep: int = _QUOTE_KEEP) -> str:
    """`value` as an error quotes it, a long one cut with its length shown: `fleet.errors.quote`'s rule (this
    package imports nothing of the project; a test holds the two to one output)."""
    text = value if isinstance(value, str) else repr(value)

    def shown(part: str) -> str:
        return repr(part) if isinstance(value, str) else part

    if len(text) <= keep and len(shown(text)) <= keep + 2:
        return shown(text)
    n = min(len(text), keep)
    while n > 1 and len(shown(text[:n])) > keep + 2:
        n -= 1
    return f"{shown(text[:n] + '…')} ({len(text)} characters)"


def _text(field: str, value: object) -> str:
    if not isinstance(value, str):
        raise RenderError(field, f"must be a string, not {type(value).__name__}")
    return value


def _match(field: str, value: object, pattern: re.Pattern[str], expected: str) -> None:
    if not pattern.fullmatch(_text(field, value)):  # whole: `$` alone would let a trailing newline through
        raise RenderError(field, f"{_quote(value)} is not {expected}")


def _port(field: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 65535:
        raise RenderError(field, f"{_quote(value)} is not a port number (1-65535)")


def _path(field: str, value: object) -> None:
    text = _text(field, value)
    if not text.startswith("/"):
        raise RenderError(field, f"{_quote(value)} is not an absolute path")
    if not _PATH_RE.fullmatch(text) or any(part in (".", "..") for part in text.split("/")):
        raise RenderError(
            field,
            f"{_quote(value)} is not a plain absolute path (letters, digits, '._+@-' between "
            f"single slashes, no '.' or '..', no trailing slash, not '/')",
        )


def _crawl_user(name: object, uid: object) -> None:
    _match("crawl_user", name, _USER_RE, "a user name (lower-case letters, digits, '_' or '-', max 32)")
    if name == "root":
        raise RenderError("crawl_user", "must not be root: the node agent and Chromium run as this user")
    if isinstance(uid, bool) or not isinstance(uid, int) or not _CRAWL_UID_MIN <= uid <= _CRAWL_UID_MAX:
        raise RenderError("crawl_uid", f"{_quote(uid)} is not a uid ({_CRAWL_UID_MIN}-{_CRAWL_UID_MAX})")


def _s3_key(field: str, value: object) -> None:
    text = _text(field, value)
    if not text or text.startswith("/") or text.endswith("/"):
        raise RenderError(field, f"{_quote(value)} is not an S3 object key (empty, or starts or ends with '/')")
    if len(text.encode()) > _S3_KEY_MAX:
        raise RenderError(field, f"longer than {_S3_KEY_MAX} bytes")
    if not text.isprintable():
        raise RenderError(field, f"{_quote(value)} contains control or separator characters")


def _check_common(p: NodeUserData | HubUserData) -> None:
    _match("region", p.region, _REGION_RE, "an AWS region (e.g. ap-northeast-2)")
    _match("bucket", p.bucket, _BUCKET_RE, "an S3 bucket name")
    _s3_key("bundle_key", p.bundle_key)
    for name in ("grid_port", "grid_publish_port", "grid_subscribe_port"):
        _port(name, getattr(p, name))
    ports: dict[int, str] = {}
    for name in ("grid_port", "grid_publish_port", "grid_subscribe_port"):
        other = ports.setdefault(getattr(p, name), name)
        if other != name:
            raise RenderError(name, f"{getattr(p, name)} is already {other} (the hub listens on all three)")
    _path("install_dir", p.install_dir)
    _path("state_dir", p.state_dir)
    _match("imds_url", p.imds_url, _IMDS_URL_RE, "an http URL without a path (e.g. http://169.254.169.254)")
    if p.log_group:
        _match("log_group", p.log_group, _LOG_GROUP_RE, "a CloudWatch Logs group name (e.g. /gridfleet/node)")
    name = _text("grid_secret_parameter", p.grid_secret_parameter)
    if not _PARAMETER_RE.fullmatch(name) or name.split("/")[1].lower().startswith(("aws", "ssm")):
        raise RenderError("grid_secret_parameter", f"{name!r} is not an SSM parameter path (e.g. /gf/grid-secret)")


# --- parameters ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class NodeUserData:
    """What a node's user-data needs: the run, where the code and config are, EFS, and the hub."""

    run_id: str
    region: str
    bucket: str  # S3 bucket holding the bundle and the run's config
    bundle_key: str  # e.g. "bundle/gridfleet-bundle.tar.gz"
    config_key: str  # e.g. "runs/2026-11-21/fleet.yaml": the run's config for nodes
    efs_id: str  # e.g. "fs-0123456789abcdef0"
    hub_address: str  # private IP or DNS name of the hub (its Grid)
    grid_secret_parameter: str  # the SSM parameter the hub put the Grid secret in: its name, never the secret
    grid_port: int = 4444
    grid_publish_port: int = 4442
    grid_subscribe_port: int = 4443
    node_port: int = 5555
    install_dir: str = "/opt/gridfleet"
    state_dir: str = "/var/lib/gridfleet"
    efs_mount: str = "/efs"
    boot_timeout_s: int = 600  # give up (report + shut down) if the bootstrap is not done by then
    imds_url: str = "http://169.254.169.254"
    crawl_user: str = "gridfleet"  # the agent, its Grid node and Chromium run as this user, never as root
    crawl_uid: int = 2000  # its uid and gid: the POSIX user of every site's EFS access point
    table: str = "TrendlyzeStatus"  # a bootstrap that fails before gridfleet is installed reports there
    log_group: str = ""  # CloudWatch Logs group of the node's logs ("": not shipped)

    def __post_init__(self) -> None:
        _match("run_id", self.run_id, _RUN_ID_RE, "a run id (letters, digits, '.', '_' or '-', max 64)")
        _match("table", self.table, _TABLE_RE, "a DynamoDB table name")
        _crawl_user(self.crawl_user, self.crawl_uid)
        _check_common(self)
        _s3_key("config_key", self.config_key)
        _match("efs_id", self.efs_id, _EFS_ID_RE, "an EFS file system id (fs-<hex>)")
        _match("hub_address", self.hub_address, _HOST_RE, "a DNS name or an IPv4 address")
        _port("node_port", self.node_port)
        if self.node_port < 1024:
            raise RenderError(
                "node_port",
                f"{self.node_port} is a privileged port: the Grid node runs as {self.crawl_user} (1024-65535)",
            )
        _path("efs_mount", self.efs_mount)
        b = self.boot_timeout_s
        if isinstance(b, bool) or not isinstance(b, int) or not 1 <= b <= 86400:
            raise RenderError("boot_timeout_s", f"{_quote(b)} is not a number of seconds (1-86400)")


@dataclass(frozen=True)
class HubUserData:
    """What the hub's user-data needs: where the code and config are, the Grid's ports, how it stops."""

    region: str
    bucket: str
    bundle_key: str
    hub_config_key: str  # e.g. "config/fleet.yaml"
    grid_secret_parameter: str  # where the hub puts the Grid secret it makes (an SSM SecureString's name)
    grid_port: int = 4444
    grid_publish_port: int = 4442
    grid_subscribe_port: int = 4443
    install_dir: str = "/opt/gridfleet"
    state_dir: str = "/var/lib/gridfleet"
    self_stop: str = "shutdown"  # "shutdown" | "terminate" | "none"
    imds_url: str = "http://169.254.169.254"
    log_group: str = ""  # CloudWatch Logs group of the hub's logs ("": not shipped)
    grid_secret_key: str = ""  # the KMS key of that SecureString, by alias ("": the account's aws/ssm key)

    def __post_init__(self) -> None:
        _check_common(self)
        key = _text("grid_secret_key", self.grid_secret_key)
        if key and not _KMS_ALIAS_RE.fullmatch(key):
            raise RenderError("grid_secret_key", f"{key!r} is not a KMS key alias (alias/<name>)")
        _s3_key("hub_config_key", self.hub_config_key)
        if self.self_stop not in SELF_STOP_CHOICES:
            raise RenderError("self_stop", f"{_quote(self.self_stop)} is not one of {', '.join(SELF_STOP_CHOICES)}")


# --- templates ----------------------------------------------------------------------------------
_YAML_UNSAFE = re.compile("[\x7f-\x9f\u2028\u2029\ud800-\udfff\ufeff\ufffe\uffff]")


def _tojson(value: Any) -> str:
    """JSON for a YAML document: no HTML escapes (user-data is not HTML, and it has a size limit).

    Non-ASCII text stays as it is, except the characters YAML 1.1 reads as line
    breaks or refuses, which are escaped; an undefined value fails.
    """
    if isinstance(value, jinja2.Undefined):
        str(value)  # StrictUndefined raises UndefinedError here
    text = json.dumps(value, ensure_ascii=False)
    return _YAML_UNSAFE.sub(lambda m: f"\\u{ord(m.group()):04x}", text)


def _shquote(value: Any) -> str:
    """One shell word for a string or an integer; an undefined value fails."""
    if isinstance(value, bool) or not isinstance(value, (str, int, jinja2.Undefined)):
        raise TypeError(f"shquote: cannot quote {type(value).__name__} {value!r}")
    return shlex.quote(str(value))  # str() of a StrictUndefined raises UndefinedError


@lru_cache(maxsize=1)
def environment() -> jinja2.Environment:
    """The Jinja environment of the templates: strict about undefined names, no autoescaping."""
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(TEMPLATES_DIR)),
        undefined=jinja2.StrictUndefined,
        autoescape=False,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["shquote"] = _shquote
    env.filters["tojson"] = _tojson
    return env


def _render(name: str, context: dict[str, Any]) -> str:
    return environment().get_template(name).render(context)


def _cloud_config(template: str, script_path: str, script: str, env_path: str, env_file: str) -> str:
    """The cloud-config: the boot script is written gzip-compressed (cloud-init's `gz+b64`), so that it fits EC2's
    16 KB of user-data with room to spare."""
    script_gz = base64.b64encode(gzip.compress(script.encode(), mtime=0)).decode()
    context = {"script_path": script_path, "script_gz": script_gz, "env_path": env_path, "env_file": env_file}
    text = _render(template, {**context, "agent_log": NODE_AGENT_LOG})
    size = len(text.encode())
    if size > USER_DATA_LIMIT:
        raise RenderError("user-data", f"{size} bytes, over EC2's limit of {USER_DATA_LIMIT} bytes")
    return text


def boot_script(user_data: str) -> str:
    """The boot script inside a user-data `render_node` or `render_hub` made (for `gridfleet render --script`)."""
    for item in yaml.safe_load(user_data)["write_files"]:
        if item["path"] in (NODE_BOOT_SCRIPT, HUB_BOOT_SCRIPT):
            return gzip.decompress(base64.b64decode(item["content"])).decode()
    raise ValueError("no boot script in this user-data")


def render_node(p: NodeUserData) -> str:
    """The ``#cloud-config`` user-data of a node instance."""
    if not isinstance(p, NodeUserData):
        raise TypeError(f"render_node needs NodeUserData, not {type(p).__name__}")
    p.__post_init__()  # again, in case a field was changed behind the frozen dataclass's back
    ctx = dataclasses.asdict(p)
    # amazon-efs-utils.deb, when the AMI and apt lack it, sits beside the bundle.
    ctx["efs_utils_key"] = posixpath.join(posixpath.dirname(p.bundle_key), "amazon-efs-utils.deb")
    ctx["crawl_home"] = posixpath.join(p.state_dir, "home")
    return _cloud_config(
        "node.yaml.j2", NODE_BOOT_SCRIPT, _render("node-boot.sh.j2", ctx), NODE_ENV_FILE, _render("node.env.j2", ctx)
    )


def render_hub(p: HubUserData) -> str:
    """The ``#cloud-config`` user-data of the hub instance."""
    if not isinstance(p, HubUserData):
        raise TypeError(f"render_hub needs HubUserData, not {type(p).__name__}")
    p.__post_init__()
    ctx = dataclasses.asdict(p)
    return _cloud_config(
        "hub.yaml.j2", HUB_BOOT_SCRIPT, _render("hub-boot.sh.j2", ctx), HUB_ENV_FILE, _render("hub.env.j2", ctx)
    )


def render_bake(
    install_dir: str = "/opt/gridfleet", state_dir: str = "/var/lib/gridfleet", crawl_user: str = "gridfleet"
) -> str:
    """The node image's bake script (infra/packer/bake.sh): the node boot script's own install steps, run once
    into an image. Its crawl user and uid default to `crawl_user` and 2000 (fleet.crawl_user, fleet.crawl_uid);
    GRIDFLEET_CRAWL_USER and GRIDFLEET_CRAWL_UID choose others when it runs."""
    _path("install_dir", install_dir)
    _path("state_dir", state_dir)
    _crawl_user(crawl_user, NodeUserData.crawl_uid)
    ctx = {"install_dir": install_dir, "state_dir": state_dir, "crawl_user": crawl_user}
    return _render("bake.sh.j2", {**ctx, "crawl_uid": NodeUserData.crawl_uid})
