"""A minimal etcd v3 client over the gRPC-JSON gateway, with TLS and etcd's own users and roles.

Only the standard library (``http.client``, ``ssl``): no gRPC or protobuf dependency, and the same
calls work against etcd 3.4 (Debian's ``etcd-server``) and later. :class:`EtcdSecurity` says how to
reach etcd: the CA that signed its server certificate, the client certificate that
``--client-cert-auth`` asks for, and an etcd user whose token goes in the ``Authorization`` header of
every call. Tokens expire (``--auth-token-ttl``); the client authenticates again and retries once.

Plain ``http://`` is for tests on loopback only, and only with ``insecure_plaintext=True``: a client
never sends a password or a token in clear text to another host. ``http.client`` is used rather than
``urllib`` so that no ``http_proxy`` variable can route a call (and its token) through a proxy.

Every call has a finite timeout. No endpoint answering raises :class:`RegistryUnavailable`; a refused
TLS handshake, a wrong password or a missing permission raises :class:`RegistryDenied`, never retried
as if it were an outage.

**Why not etcd3gw.** etcd3gw (2.7.0, 2026) is a maintained client of the same gateway and was tried
for this module (issue 28). It has TLS client certificates, leases, transactions (compare-and-swap)
and watch, but not what the registry needs around them:

- no etcd users: nothing sends an ``Authorization`` token or authenticates again when the token
  expires (``--auth-token-ttl``); the registry's prefill/decode roles rest on users;
- one endpoint per client: no failover across the members of a cluster;
- answers are read whole (``resp.json()``) with no size cap, and a watch stream is parsed one
  ``iter_content`` chunk per event, so a chunk split mid-event breaks it and a huge one is read
  whole: a compromised or confused endpoint can make a rank allocate without bound;
- it goes through ``requests``, which by default honours ``http(s)_proxy`` variables: a token could
  be sent through a proxy unless every caller passes a session with ``trust_env=False``;
- it adds ``requests``, ``futurist`` and ``pbr`` to a rank's dependencies for ~400 lines.

Wrapping it to add the first four would keep most of this module and add a layer; so this module
stays, with only the standard library.
"""

from __future__ import annotations

import base64
import http.client
import ipaddress
import json
import os
import ssl
import threading
import time
import urllib.parse
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = ["EtcdClient", "EtcdSecurity", "RegistryDenied", "RegistryError", "RegistryUnavailable"]

#: Answers larger than this are not from an etcd we talk to (a range of our prefix is a few KiB).
MAX_ANSWER = 4 << 20
#: What etcd says when a token has expired or predates a change of users/roles: authenticate again.
_STALE_TOKEN = ("invalid auth token", "auth store is old")
#: etcd's words for "not allowed" (the gateway does not always map them to 401/403).
_DENIED = ("permission denied", "authentication failed", "user name is empty", *_STALE_TOKEN)


class RegistryError(RuntimeError):
    """etcd answered, but not with what was asked (a bad name, a malformed record, an etcd error)."""


class RegistryUnavailable(RegistryError):
    """No etcd endpoint answered within the timeout."""


class RegistryDenied(RegistryError):
    """etcd, or the TLS layer in front of it, refused us: an untrusted server certificate, no or a
    wrong client certificate, a wrong user or password, or a role without the permission asked for."""


def b64(data: str | bytes) -> str:
    """``data`` as the base64 text the JSON gateway expects for keys and values."""
    raw = data.encode() if isinstance(data, str) else data
    return base64.b64encode(raw).decode("ascii")


def unb64(data: str) -> bytes:
    """The bytes of a base64 key or value from the gateway."""
    return base64.b64decode(data.encode("ascii"), validate=True)


def prefix_end(prefix: bytes) -> bytes:
    """The smallest key greater than every key starting with ``prefix`` (etcd's range_end)."""
    end = bytearray(prefix)
    for i in range(len(end) - 1, -1, -1):
        if end[i] < 0xFF:
            end[i] += 1
            return bytes(end[: i + 1])
    return b"\0"


def is_loopback(host: str) -> bool:
    """Whether ``host`` (a name or an address) is this machine's loopback."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


@dataclass(frozen=True)
class EtcdSecurity:
    """How to reach etcd: TLS material and an etcd user (all optional, checked together).

    ``ca_file``: PEM CA bundle that signed etcd's server certificate (None: the system's CAs).
    ``cert_file``/``key_file``: this client's certificate, for etcd's ``--client-cert-auth``.
    ``user``/``password``: an etcd user (``etcdctl user add``); every call then carries its token.
    ``insecure_plaintext``: allow ``http://`` endpoints; they must be loopback and must not carry a
    user. Only for tests on one machine.
    """

    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None
    user: str | None = None
    password: str | None = field(default=None, repr=False)
    insecure_plaintext: bool = False

    def __post_init__(self) -> None:
        if (self.cert_file is None) != (self.key_file is None):
            raise ValueError("etcd security: cert_file and key_file go together (the client certificate and its key)")
        if (self.user is None) != (self.password is None):
            raise ValueError("etcd security: user and password go together")
        for what in ("ca_file", "cert_file", "key_file"):
            path = getattr(self, what)
            if path is not None and not os.path.isfile(path):
                raise ValueError(f"etcd security: {what} {path!r} is not a readable file")

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> EtcdSecurity:
        """Read ``KVPOLICY_ETCD_CACERT``, ``KVPOLICY_ETCD_CERT``, ``KVPOLICY_ETCD_KEY``,
        ``KVPOLICY_ETCD_USER``, ``KVPOLICY_ETCD_PASSWORD_FILE`` (a file holding the password, so that it
        never shows in ``/proc/*/environ``) and ``KVPOLICY_ETCD_INSECURE_PLAINTEXT=1``."""
        env = os.environ if environ is None else environ
        password = None
        password_file = env.get("KVPOLICY_ETCD_PASSWORD_FILE")
        if password_file:
            try:
                with open(password_file, encoding="utf-8") as f:
                    password = f.read().rstrip("\r\n")
            except OSError as exc:
                raise ValueError(f"KVPOLICY_ETCD_PASSWORD_FILE={password_file!r}: {exc.strerror}") from None
        return cls(
            ca_file=env.get("KVPOLICY_ETCD_CACERT") or None,
            cert_file=env.get("KVPOLICY_ETCD_CERT") or None,
            key_file=env.get("KVPOLICY_ETCD_KEY") or None,
            user=env.get("KVPOLICY_ETCD_USER") or None,
            password=password,
            insecure_plaintext=env.get("KVPOLICY_ETCD_INSECURE_PLAINTEXT") == "1",
        )

    def tls_context(self) -> ssl.SSLContext:
        """The TLS settings for ``https://`` endpoints: the server certificate must chain to
        ``ca_file`` and name the host; TLS 1.2 at least; this client's certificate if given."""
        try:
            context = ssl.create_default_context(cafile=self.ca_file)
            context.minimum_version = ssl.TLSVersion.TLSv1_2
            if self.cert_file is not None:
                context.load_cert_chain(self.cert_file, self.key_file)
        except (ssl.SSLError, OSError) as exc:
            raise ValueError(
                f"etcd security: cannot load ca_file={self.ca_file!r} / cert_file={self.cert_file!r} / key_file={self.key_file!r} as PEM: {exc}"
            ) from None
        return context


@dataclass(frozen=True)
class _Endpoint:
    url: str
    host: str
    port: int
    tls: bool


def _parse_endpoint(url: str, security: EtcdSecurity) -> _Endpoint:
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"etcd endpoint {url!r} must be an https://host:port URL (http:// only for loopback tests)")
    if parts.path.strip("/") or parts.query or parts.username:
        raise ValueError(f"etcd endpoint {url!r} must be scheme://host:port and nothing more")
    try:
        port = parts.port or 2379
    except ValueError:
        raise ValueError(f"etcd endpoint {url!r} has a bad port") from None
    if parts.scheme == "http":
        if not security.insecure_plaintext:
            raise ValueError(
                f"etcd endpoint {url!r} is plain http: use https:// with a CA file (KVPOLICY_ETCD_CACERT), or insecure_plaintext=True for a loopback test"
            )
        if not is_loopback(parts.hostname):
            raise ValueError(f"etcd endpoint {url!r}: plain http is allowed to loopback only; use https://")
        if security.user is not None:
            raise ValueError(f"etcd endpoint {url!r}: refusing to send etcd credentials over plain http; use https://")
    return _Endpoint(url.rstrip("/"), parts.hostname, port, parts.scheme == "https")


class EtcdClient:
    """An etcd v3 client over the gRPC-JSON gateway.

    ``endpoints``: client URLs (a comma-separated string, as in ``NIXL_ETCD_ENDPOINTS``, or a
    sequence), tried in order. ``security``: see :class:`EtcdSecurity`; None reads it from the
    environment (:meth:`EtcdSecurity.from_env`). Safe to share between threads.
    """

    def __init__(self, endpoints: str | Sequence[str], *, security: EtcdSecurity | None = None, timeout_s: float = 2.0) -> None:
        if isinstance(endpoints, str):
            endpoints = [e.strip() for e in endpoints.split(",") if e.strip()]
        if not endpoints:
            raise ValueError("at least one etcd endpoint is needed")
        if not (0 < timeout_s < float("inf")):
            raise ValueError(f"timeout_s must be finite and positive, got {timeout_s!r}")
        self.security = EtcdSecurity.from_env() if security is None else security
        self._endpoints = tuple(_parse_endpoint(e, self.security) for e in endpoints)
        self.endpoints: tuple[str, ...] = tuple(e.url for e in self._endpoints)
        self.timeout_s = float(timeout_s)
        self._tls = self.security.tls_context() if any(e.tls for e in self._endpoints) else None
        self._token: str | None = None
        self._token_lock = threading.Lock()
        #: How often a token was (re)acquired: 1 after the first call with a user, more after expiries.
        self.authentications = 0

    # -- transport ---------------------------------------------------------------------------------

    def _post(self, endpoint: _Endpoint, path: str, data: bytes, token: str | None, timeout: float) -> tuple[int, bytes]:
        if endpoint.tls:
            conn: http.client.HTTPConnection = http.client.HTTPSConnection(endpoint.host, endpoint.port, timeout=timeout, context=self._tls)
        else:
            conn = http.client.HTTPConnection(endpoint.host, endpoint.port, timeout=timeout)
        headers = {"Content-Type": "application/json"}
        if token is not None:
            headers["Authorization"] = token
        try:
            conn.request("POST", path, body=data, headers=headers)
            response = conn.getresponse()
            return response.status, response.read(MAX_ANSWER)
        finally:
            conn.close()

    def _once(self, path: str, body: Mapping[str, Any], timeout: float, token: str | None) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        data = json.dumps(body).encode()
        errors: list[str] = []
        denied: list[str] = []
        for endpoint in self._endpoints:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            try:
                status, payload = self._post(endpoint, path, data, token, left)
            except ssl.SSLCertVerificationError as exc:
                # Not an outage: this server is not the one our CA vouches for.
                trusted = self.security.ca_file or "the system's CAs"
                denied.append(f"{endpoint.url}: its certificate does not verify against {trusted} ({exc.verify_message})")
                continue
            except ssl.SSLError as exc:
                # The server refused our certificate (none, or signed by a CA it does not trust).
                denied.append(f"{endpoint.url}: TLS refused, check cert_file/key_file ({exc.reason or exc})")
                continue
            except (OSError, http.client.HTTPException) as exc:
                errors.append(f"{endpoint.url}: {exc or type(exc).__name__}")
                continue
            return self._answer(endpoint, path, status, payload)
        if denied:
            raise RegistryDenied(f"etcd refused {path}: {'; '.join(denied + errors)}")
        raise RegistryUnavailable(f"no etcd endpoint answered {path} within {timeout:.1f}s ({'; '.join(errors) or 'timed out'})")

    @staticmethod
    def _answer(endpoint: _Endpoint, path: str, status: int, payload: bytes) -> dict[str, Any]:
        try:
            answer = json.loads(payload or b"{}")
        except ValueError:
            answer = None
        if not isinstance(answer, dict):
            text = payload[:200].decode("utf-8", "replace").strip()
            raise RegistryError(f"etcd at {endpoint.url} answered {path} with HTTP {status} and no JSON map: {text!r}")
        # The gateway maps gRPC errors to HTTP statuses; a streaming call (keepalive) answers 200
        # with {"error": {"message": ..}} instead of {"result": ..}.
        error = answer.get("error")
        if isinstance(error, dict):
            error = error.get("message") or json.dumps(error)
        if status >= 400 or (error and "result" not in answer):
            detail = str(error or answer.get("message") or f"HTTP {status}")
            lowered = detail.lower()
            if status in (401, 403) or any(s in lowered for s in _DENIED):
                raise RegistryDenied(f"etcd at {endpoint.url} refused {path}: {detail}")
            raise RegistryError(f"etcd at {endpoint.url} refused {path}: {detail}")
        return answer

    def _authenticate(self, timeout: float) -> str:
        security = self.security
        answer = self._once("/v3/auth/authenticate", {"name": security.user, "password": security.password}, timeout, None)
        token = answer.get("token")
        if not isinstance(token, str) or not token:
            raise RegistryDenied(f"etcd gave no token to user {security.user!r} (is auth enabled?)")
        self.authentications += 1
        return token

    def call(self, path: str, body: Mapping[str, Any], *, timeout_s: float | None = None) -> dict[str, Any]:
        """POST ``body`` to ``path`` (e.g. ``/v3/kv/put``) on the first endpoint that answers, with
        this client's token; an expired token is renewed once."""
        timeout = self.timeout_s if timeout_s is None else timeout_s
        if self.security.user is None:
            return self._once(path, body, timeout, None)
        deadline = time.monotonic() + timeout
        with self._token_lock:
            if self._token is None:
                self._token = self._authenticate(timeout)
            token = self._token
        try:
            return self._once(path, body, max(0.05, deadline - time.monotonic()), token)
        except RegistryDenied as exc:
            if not any(s in str(exc) for s in _STALE_TOKEN):
                raise
        with self._token_lock:
            if self._token == token:  # another thread may have renewed it meanwhile
                self._token = self._authenticate(max(0.05, deadline - time.monotonic()))
            token = self._token
        return self._once(path, body, max(0.05, deadline - time.monotonic()), token)

    # -- key/value ---------------------------------------------------------------------------------

    def put(self, key: str, value: bytes, *, lease: int = 0) -> int:
        """Write ``key``; with ``lease``, the key disappears when the lease expires or is revoked.
        Returns the store's revision after the write (the key's ``mod_revision``)."""
        body: dict[str, Any] = {"key": b64(key), "value": b64(value)}
        if lease:
            body["lease"] = str(lease)
        return int(self.call("/v3/kv/put", body).get("header", {}).get("revision", 0))

    def get_prefix(self, prefix: str) -> dict[str, bytes]:
        """Every key starting with ``prefix`` and its value."""
        return {key: unb64(kv.get("value", "")) for key, kv in self.get_prefix_entries(prefix).items()}

    def get_prefix_entries(self, prefix: str) -> dict[str, dict[str, Any]]:
        """Every key starting with ``prefix`` and the gateway's entry for it (``value`` base64,
        ``mod_revision``, ``lease``), as :meth:`get_entry` gives one."""
        raw = prefix.encode()
        answer = self.call("/v3/kv/range", {"key": b64(raw), "range_end": b64(prefix_end(raw))})
        return {unb64(kv["key"]).decode(errors="replace"): kv for kv in answer.get("kvs", [])}

    def get(self, key: str) -> bytes | None:
        """The value of ``key``, or None if it does not exist."""
        kv = self.get_entry(key)
        return None if kv is None else unb64(kv.get("value", ""))

    def get_entry(self, key: str, *, timeout_s: float | None = None) -> dict[str, Any] | None:
        """The gateway's entry for ``key`` (``value`` base64, ``mod_revision``, ``lease``), or None."""
        kvs = self.call("/v3/kv/range", {"key": b64(key)}, timeout_s=timeout_s).get("kvs", [])
        return kvs[0] if kvs else None

    def delete(self, key: str) -> int:
        """Delete ``key``; returns how many keys were deleted (0 or 1)."""
        return int(self.call("/v3/kv/deleterange", {"key": b64(key)}).get("deleted", 0))

    def restore_if_changed(self, key: str, value: bytes, *, mod_revision: int, lease: int = 0) -> tuple[int, dict[str, Any] | None] | None:
        """Compare-and-swap in one transaction: if ``key`` is still as written at ``mod_revision``,
        change nothing and return None. Otherwise read what it holds and write ``value`` (on ``lease``)
        back; returns ``(the key's new mod_revision, the entry found, None if the key was gone)``."""
        revision, found, changed = self._swap(key, value, mod_revision=mod_revision, lease=lease, rewrite=False)
        return (revision, found) if changed else None

    def rewrite_unless_changed(self, key: str, value: bytes, *, mod_revision: int, lease: int = 0) -> tuple[int, dict[str, Any] | None, bool]:
        """Write ``value`` (on ``lease``) to ``key`` in one transaction that first compares its
        ``mod_revision``: a heartbeat when the key is still as written at ``mod_revision``, a
        restoration when someone else changed or deleted it. Returns ``(the key's new mod_revision,
        the entry found if it had changed, else None; whether it had changed)``: the entry is None
        too when a changed key was gone."""
        return self._swap(key, value, mod_revision=mod_revision, lease=lease, rewrite=True)

    def _swap(self, key: str, value: bytes, *, mod_revision: int, lease: int, rewrite: bool) -> tuple[int, dict[str, Any] | None, bool]:
        put: dict[str, Any] = {"key": b64(key), "value": b64(value)}
        if lease:
            put["lease"] = str(lease)
        txn: dict[str, Any] = {
            "compare": [{"key": b64(key), "target": "MOD", "result": "EQUAL", "mod_revision": str(mod_revision)}],
            "failure": [{"request_range": {"key": b64(key)}}, {"request_put": put}],
        }
        if rewrite:
            txn["success"] = [{"request_put": put}]
        answer = self.call("/v3/kv/txn", txn)
        # The store's revision after the transaction: the put's, when one was made.
        revision = int(answer.get("header", {}).get("revision", 0))
        if answer.get("succeeded"):
            return revision, None, False
        responses = answer.get("responses") or [{}]
        kvs = responses[0].get("response_range", {}).get("kvs", [])
        return revision, (kvs[0] if kvs else None), True

    # -- leases ------------------------------------------------------------------------------------

    def grant(self, ttl_s: int) -> int:
        """A new lease of ``ttl_s`` seconds; returns its id."""
        answer = self.call("/v3/lease/grant", {"TTL": int(ttl_s)})
        lease = int(answer.get("ID", 0))
        if not lease:
            raise RegistryError(f"etcd granted no lease: {answer.get('error', answer)}")
        return lease

    def keepalive(self, lease: int) -> int:
        """Refresh ``lease`` once; returns its TTL, 0 if the lease no longer exists."""
        answer = self.call("/v3/lease/keepalive", {"ID": str(lease)})
        return int(answer.get("result", {}).get("TTL", 0))

    def revoke(self, lease: int, *, timeout_s: float | None = None) -> None:
        """Revoke ``lease``, deleting every key attached to it. A lease already gone is not an error."""
        try:
            self.call("/v3/lease/revoke", {"ID": str(lease)}, timeout_s=timeout_s)
        except (RegistryUnavailable, RegistryDenied):
            raise
        except RegistryError as exc:
            if "not found" not in str(exc):
                raise
