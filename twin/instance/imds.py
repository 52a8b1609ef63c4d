"""An instance's IMDSv2, listening inside its network namespace at the address EC2 uses.

It reuses the embedded default's emulator (`embedded.imds_server`: tokens, instance id, address, tags,
spot notice), which serves many instances each under a prefix; here a request for ``/latest/...`` is
served as the one instance's ``/<id>/latest/...``, so the rendered ``imds_url`` works unchanged. The
listening socket is made by a thread that has entered the instance's namespace (setns), so it exists only
there, while the server runs in this process; tags are served when `tags` is given (EC2's
``InstanceMetadataTags``), and `spot_notice()` posts an interruption notice. With `role` (the instance
profile's role) it also serves ``iam/security-credentials/<role>``: the credentials of that role's session named
after the instance, as EC2 hands them (`mint`: the twin's STS, AssumeRole with the instance id as the session
name), so that, as on AWS, the SDKs and CLI inside pick them up by themselves and `sts get-caller-identity` says
`<role id>:<instance id>`, the `aws:userid` a node's own S3 prefix is named by. Without `mint`, keys made up per
instance, which the twin's AWS (a moto server) takes as any.
"""

from __future__ import annotations

import ctypes
import json
import os
import secrets
import threading
from collections.abc import Callable, Mapping
from datetime import UTC, datetime, timedelta
from http.server import ThreadingHTTPServer
from typing import Any

from embedded.imds_server import _Handler, _State
from twin.instance.network import METADATA_ADDRESS

_CLONE_NEWNET = 0x40000000


_CREDENTIALS = "/latest/meta-data/iam/security-credentials/"


class _InstanceHandler(_Handler):
    server: _Server  # type: ignore[assignment]

    def parse_request(self) -> bool:
        ok = super().parse_request()
        if ok and self.path.startswith("/latest/") and not self.path.startswith(_CREDENTIALS):
            self.path = f"/{self.server.instance_id}{self.path}"
        return ok

    def do_GET(self) -> None:
        if not self.path.startswith(_CREDENTIALS):
            super().do_GET()
        elif self.headers.get("X-aws-ec2-metadata-token") not in self.server.state.tokens:
            self._send(401, "IMDSv2: a session token is required")
        elif self.server.role and self.path.rstrip("/") == _CREDENTIALS.rstrip("/"):
            self._send(200, self.server.role)
        elif self.server.role and self.path == _CREDENTIALS + self.server.role:
            self._send(200, json.dumps(self.server.credentials()), "application/json")
        else:
            self._send(404, "not found")


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(
        self,
        address: tuple[str, int],
        state: _State,
        instance_id: str,
        role: str | None,
        mint: Callable[[], Mapping[str, str]] | None = None,
    ) -> None:
        self.state = state
        self.instance_id = instance_id
        self.role = role
        self._mint = mint
        self._key: tuple[str, str, str] | None = None
        self._lock = threading.Lock()
        super().__init__(address, _InstanceHandler)

    def _keys(self) -> tuple[str, str, str]:
        """The instance's (key id, secret, token): its role session's, minted once, or made up."""
        with self._lock:
            if self._key is None:
                if self._mint is not None:
                    c = self._mint()
                    self._key = (c["AccessKeyId"], c["SecretAccessKey"], c["SessionToken"])
                else:
                    key = f"ASIATWIN{secrets.token_hex(6).upper()}"
                    self._key = (key, secrets.token_urlsafe(30), f"twin-{self.instance_id}")
            return self._key

    def credentials(self) -> dict[str, str]:
        now = datetime.now(UTC)
        key, secret, token = self._keys()
        return {
            "Code": "Success",
            "LastUpdated": now.strftime("%Y-%m-%dT%H:%M:%SZ"),
            "Type": "AWS-HMAC",
            "AccessKeyId": key,
            "SecretAccessKey": secret,
            "Token": token,
            "Expiration": (now + timedelta(hours=6)).strftime("%Y-%m-%dT%H:%M:%SZ"),
        }


def _in_netns(netns: str, make: Any) -> Any:
    """`make()` called on a thread that has entered the named network namespace."""
    result: dict[str, Any] = {}

    def run() -> None:
        libc = ctypes.CDLL(None, use_errno=True)
        fd = os.open(f"/run/netns/{netns}", os.O_RDONLY)
        try:
            if libc.setns(fd, _CLONE_NEWNET) != 0:
                raise OSError(ctypes.get_errno(), f"setns into {netns}")
            result["value"] = make()
        except BaseException as e:  # handed back to the caller's thread
            result["error"] = e
        finally:
            os.close(fd)

    t = threading.Thread(target=run)
    t.start()
    t.join()
    if "error" in result:
        raise result["error"]
    return result["value"]


class InstanceImds:
    """The IMDSv2 of one instance, at ``http://169.254.169.254`` inside `netns`."""

    def __init__(
        self,
        netns: str,
        instance_id: str,
        local_ipv4: str,
        tags: dict[str, str] | None = None,
        role: str | None = None,
        port: int = 80,
        meta: dict[str, str] | None = None,
        mint: Callable[[], Mapping[str, str]] | None = None,
    ) -> None:
        self.instance_id = instance_id
        self.state = _State(token=secrets.token_urlsafe(32))  # no spot notice over HTTP
        inst = self.state.instance(instance_id)
        inst["local-ipv4"] = local_ipv4
        inst["tags"] = dict(tags or {})
        inst["meta"] = dict(meta or {})  # more of meta-data/, by path: placement/region, instance-type, ...
        self._httpd: _Server = _in_netns(
            netns, lambda: _Server((METADATA_ADDRESS, port), self.state, instance_id, role, mint)
        )
        self._thread = threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True)
        self._thread.start()

    def spot_notice(self) -> None:
        """EC2's two-minute interruption notice, from now on at ``spot/instance-action``."""
        self.state.post_spot(self.instance_id)

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
