"""The EC2 instance metadata service, IMDSv2 only (a session token on every request).

Hub and node use it for their own instance id and private address, the run id
tag of a hub, and the spot interruption notice. `base_url` is configurable
(`aws.imds_url`) so tests and the embedded default can point at an emulator.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Any

TOKEN_TTL_S = 21600


class ImdsError(Exception):
    """The metadata service did not answer (not on EC2, or IMDS disabled)."""


class Imds:
    def __init__(
        self,
        base_url: str = "http://169.254.169.254",
        timeout_s: float = 2.0,
        monotonic: Callable[[], float] = time.monotonic,
    ):
        self.base = base_url.rstrip("/")
        self.timeout_s = timeout_s
        self._monotonic = monotonic
        self._token: str | None = None
        self._token_until = 0.0

    def _request(self, req: urllib.request.Request) -> str:
        try:
            with urllib.request.urlopen(req, timeout=self.timeout_s) as r:
                return r.read().decode()
        except urllib.error.HTTPError:
            raise
        except (OSError, ValueError) as e:
            raise ImdsError(f"instance metadata at {self.base} did not answer: {e}") from None

    def token(self) -> str:
        if self._token is None or self._monotonic() >= self._token_until:
            req = urllib.request.Request(
                f"{self.base}/latest/api/token",
                method="PUT",
                headers={"X-aws-ec2-metadata-token-ttl-seconds": str(TOKEN_TTL_S)},
            )
            try:
                self._token = self._request(req)
            except urllib.error.HTTPError as e:
                raise ImdsError(f"instance metadata refused a token: HTTP {e.code}") from None
            self._token_until = self._monotonic() + TOKEN_TTL_S - 60
        return self._token

    def get(self, path: str) -> str | None:
        """The value at /latest/<path>, or None if it does not exist (404)."""
        for retry in (False, True):
            req = urllib.request.Request(
                f"{self.base}/latest/{path.lstrip('/')}", headers={"X-aws-ec2-metadata-token": self.token()}
            )
            try:
                return self._request(req)
            except urllib.error.HTTPError as e:
                if e.code == 404:
                    return None
                if e.code == 401 and not retry:  # the token expired: get a new one once
                    self._token = None
                    continue
                raise ImdsError(f"instance metadata {path}: HTTP {e.code}") from None
        return None

    def instance_id(self) -> str:
        value = self.get("meta-data/instance-id")
        if not value:
            raise ImdsError("instance metadata has no instance-id")
        return value

    def local_ipv4(self) -> str | None:
        return self.get("meta-data/local-ipv4")

    def tag(self, key: str) -> str | None:
        """An instance tag (needs instance metadata tags enabled on the instance)."""
        return self.get(f"meta-data/tags/instance/{key}")

    def spot_action(self) -> dict[str, Any] | None:
        """The spot interruption notice ({"action": "terminate", "time": ...}) if there is one."""
        raw = self.get("meta-data/spot/instance-action")
        if raw is None:
            return None
        try:
            return json.loads(raw)
        except ValueError:
            return {"action": "unknown", "raw": raw}
