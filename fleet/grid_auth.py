"""The Grid's secret: what a Grid node must show to register, and what a client must show to the router.

One random secret per stack (the embedded default) or per run (AWS, where the hub keeps it in SSM Parameter
Store) yields two values: the registration secret Grid nodes send with their events, and the password of the
router's HTTP basic authentication. Every process that holds the secret reads it from a file only its user can
read; it is never put on a command line, in a URL or in user-data, and its repr shows nothing of it.

On AWS the parameter holds the run's id beside the secret (`parameter_value`). A Grid node learns the secret
once, when its node boots, and a Grid hub refuses every event of a node that shows another: so a hub that boots
for a run whose secret is there already (the replacement of a hub that died) keeps it, and the nodes still
crawling register with its Grid; a hub of another run makes a new one.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
import re
import secrets
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from fleet.errors import MissingResource

#: The router's basic-auth user name: not a secret, the password is.
GRID_USER = "gridfleet"
#: What a secret is made of: URL-safe base64 (`secrets.token_urlsafe`), safe in TOML, shell and HTTP headers.
SECRET_RE = re.compile(r"[A-Za-z0-9_-]{32,128}")
#: The Grid node's log line when the hub never took its registration (a wrong or missing registration secret).
REGISTRATION_REFUSED = "Registration event failed"


@dataclass(frozen=True)
class GridSecret:
    value: str = field(repr=False)

    def __post_init__(self) -> None:
        if not SECRET_RE.fullmatch(self.value):
            raise ValueError("the Grid secret must be 32 to 128 URL-safe base64 characters")

    @classmethod
    def make(cls) -> GridSecret:
        return cls(secrets.token_urlsafe(32))

    @classmethod
    def read(cls, path: Path) -> GridSecret:
        """The secret in `path`; MissingResource (naming the file, never its content) when it holds none."""
        try:
            text = path.read_text().strip()
        except OSError as e:
            raise MissingResource(f"cannot read the Grid secret file {path}: {e.strerror}") from None
        try:
            return cls(text)
        except ValueError as e:
            raise MissingResource(f"{path}: {e}") from None

    def write(self, path: Path, owner: tuple[int, int] | None = None) -> Path:
        """Write the secret to `path`, readable by its owner only (`owner`: uid and gid to give it)."""
        return write_private(path, self.value + "\n", owner)

    def _derive(self, purpose: str) -> str:
        return hmac.new(self.value.encode(), purpose.encode(), hashlib.sha256).hexdigest()

    @property
    def registration_secret(self) -> str:
        return self._derive("grid-registration")

    @property
    def password(self) -> str:
        return self._derive("grid-router")

    @property
    def authorization(self) -> str:
        """The value of the Authorization header of a request to the router."""
        pair = f"{GRID_USER}:{self.password}".encode()
        return "Basic " + base64.b64encode(pair).decode()


def write_private(path: Path, text: str, owner: tuple[int, int] | None = None) -> Path:
    """Write `text` to `path` with mode 0600 from its first byte (written beside it, then renamed)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.unlink(missing_ok=True)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    if owner is not None:
        os.chown(tmp, *owner)
    os.replace(tmp, path)
    return path


def read_optional(path: Path | None) -> GridSecret | None:
    """The secret of `path`, or None when no file is given (a Grid without authentication)."""
    return None if path is None else GridSecret.read(path)


def hub_toml(secret: GridSecret) -> str:
    """The Grid hub's config file: nodes must show the registration secret, clients the router's user and
    password."""
    q = json.dumps  # TOML basic strings accept JSON string escapes
    return "\n".join(
        [
            "[server]",
            f"registration-secret = {q(secret.registration_secret)}",
            "",
            "[router]",
            f"username = {q(GRID_USER)}",
            f"password = {q(secret.password)}",
            "",
        ]
    )


def curl_config(secret: GridSecret) -> str:
    """A curl config (`curl -K FILE`) carrying the router's credentials, so that they are not on curl's command
    line."""
    return f"user = {json.dumps(f'{GRID_USER}:{secret.password}')}\n"  # curl's quoted strings take JSON's escapes


def parameter_value(run_id: str, secret: GridSecret) -> str:
    """What the SSM parameter holds: the run's id, a space, the secret (neither has a space in it)."""
    return f"{run_id} {secret.value}"


def secret_of_run(value: str, run_id: str) -> GridSecret | None:
    """The secret the parameter's `value` holds for `run_id`; None when it is another run's, or no such value (a
    parameter made before it held the run's id, or not by gridfleet)."""
    fields = value.split()
    if len(fields) != 2 or fields[0] != run_id:
        return None
    try:
        return GridSecret(fields[1])
    except ValueError:
        return None


def make_hub_files(
    secret_file: Path, hub_config: Path, curl_file: Path, *, run_id: str, current: str | None, parameter_file: Path
) -> bool:
    """The AWS hub's boot: the run's secret in `secret_file`, the Grid hub's config derived from it in `hub_config`
    and the router's credentials in the curl config `curl_file`, each readable by its owner only. The secret is
    the one `current` (the parameter's value as the boot read it; None: none could be read) holds for `run_id`,
    whose nodes already have it; else a new one, whose parameter value goes to `parameter_file` for the boot to
    put (absent when the secret was kept: there is nothing to put). True when the secret was kept."""
    kept = secret_of_run(current, run_id) if current is not None else None
    secret = kept or GridSecret.make()
    secret.write(secret_file)
    write_private(hub_config, hub_toml(secret))
    write_private(curl_file, curl_config(secret))
    if kept is None:
        write_private(parameter_file, parameter_value(run_id, secret))
    else:
        parameter_file.unlink(missing_ok=True)
    return kept is not None


def grid_request(
    url: str, secret: GridSecret | None, method: str = "GET", data: bytes | None = None
) -> urllib.request.Request:
    """A request to the Grid's router, carrying its credentials when the Grid has a secret."""
    req = urllib.request.Request(url, data=data, method=method)
    if secret is not None:
        req.add_unredirected_header("Authorization", secret.authorization)
    return req
