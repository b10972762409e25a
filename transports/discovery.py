"""Finding peers through etcd: rank records under a namespaced key, kept alive by a lease.

A sender publishes where it listens (its control address, NIXL agent name and pool layout) with
:meth:`EtcdRegistry.register`; receivers find it by name with :meth:`EtcdRegistry.lookup`. Each record
lives under ``/kvpolicy/<namespace>/ranks/<name>`` and is attached to a lease that a background thread
keeps alive, so the entry of a worker that dies expires after ``ttl_s`` instead of pointing at nothing.
:meth:`EtcdRegistry.list` and :meth:`EtcdRegistry.watch` show every rank of a namespace.

The client speaks etcd's v3 gRPC-JSON gateway (``/v3/kv/put``, ``/v3/kv/range``, ``/v3/lease/*``) with
the standard library: no gRPC or protobuf dependency, and the same code works against etcd 3.4
(Debian's ``etcd-server``) and later. With ``metadata="etcd"`` (see
:class:`~kvpolicy.transports.NixlTransceiver`), NIXL itself publishes each agent's metadata to the etcd
named by ``NIXL_ETCD_ENDPOINTS`` (key :func:`nixl_metadata_key`), and senders read it with this client.

Every call has a finite timeout. An unreachable etcd raises :class:`RegistryUnavailable`; it never
blocks a caller past its timeout. A registration survives an etcd outage: its keep-alive thread
retries, and if the lease was lost meanwhile it grants a new one and writes the record again.
"""

from __future__ import annotations

import base64
import json
import logging
import os
import re
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from typing import Any

log = logging.getLogger("kvpolicy.transports")

__all__ = [
    "EtcdClient",
    "EtcdRegistry",
    "RankWatch",
    "Registration",
    "RegistryError",
    "RegistryUnavailable",
    "nixl_metadata_key",
]

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._@:-]{0,127}$")
#: A record is a small JSON map; anything larger in the store is not ours and is refused.
_MAX_RECORD = 64 << 10


def nixl_metadata_key(agent: str) -> str:
    """The etcd key under which NIXL's ``send_local_metadata()`` stores agent ``agent``'s metadata
    (``NIXL_ETCD_NAMESPACE``, default ``/nixl/agents/``, then ``/<agent>/metadata``)."""
    return f"{os.environ.get('NIXL_ETCD_NAMESPACE', '/nixl/agents/')}/{agent}/metadata"


class RegistryError(RuntimeError):
    """etcd answered, but not with what was asked (a bad name, a malformed record, an etcd error)."""


class RegistryUnavailable(RegistryError):
    """No etcd endpoint answered within the timeout."""


def _b64(data: str | bytes) -> str:
    raw = data.encode() if isinstance(data, str) else data
    return base64.b64encode(raw).decode("ascii")


def _unb64(data: str) -> bytes:
    return base64.b64decode(data.encode("ascii"), validate=True)


def _prefix_end(prefix: bytes) -> bytes:
    """The smallest key greater than every key starting with ``prefix`` (etcd's range_end)."""
    end = bytearray(prefix)
    for i in range(len(end) - 1, -1, -1):
        if end[i] < 0xFF:
            end[i] += 1
            return bytes(end[: i + 1])
    return b"\0"


class EtcdClient:
    """A minimal etcd v3 client over the gRPC-JSON gateway.

    ``endpoints``: ``http://host:port`` client URLs (a comma-separated string, as in
    ``NIXL_ETCD_ENDPOINTS``, or a sequence). Each call tries them in order and raises
    :class:`RegistryUnavailable` if none answers within ``timeout_s``.
    """

    def __init__(self, endpoints: str | Sequence[str], *, timeout_s: float = 2.0) -> None:
        if isinstance(endpoints, str):
            endpoints = [e.strip() for e in endpoints.split(",") if e.strip()]
        if not endpoints:
            raise ValueError("at least one etcd endpoint is needed")
        for endpoint in endpoints:
            if not endpoint.startswith(("http://", "https://")):
                raise ValueError(f"etcd endpoint {endpoint!r} must be an http:// or https:// URL")
        if not (0 < timeout_s < float("inf")):
            raise ValueError(f"timeout_s must be finite and positive, got {timeout_s!r}")
        self.endpoints: tuple[str, ...] = tuple(e.rstrip("/") for e in endpoints)
        self.timeout_s = float(timeout_s)

    def call(self, path: str, body: Mapping[str, Any], *, timeout_s: float | None = None) -> dict[str, Any]:
        """POST ``body`` to ``path`` (e.g. ``/v3/kv/put``) on the first endpoint that answers."""
        timeout = self.timeout_s if timeout_s is None else timeout_s
        deadline = time.monotonic() + timeout
        data = json.dumps(body).encode()
        errors: list[str] = []
        for endpoint in self.endpoints:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            request = urllib.request.Request(
                endpoint + path, data=data, method="POST", headers={"Content-Type": "application/json"}
            )
            try:
                with urllib.request.urlopen(request, timeout=left) as response:
                    payload = response.read(_MAX_RECORD * 64)
            except urllib.error.HTTPError as exc:
                # The gateway maps gRPC errors to HTTP statuses with a JSON body naming the error.
                try:
                    detail = json.loads(exc.read(4096) or b"{}").get("error") or exc.reason
                except ValueError:
                    detail = exc.reason
                raise RegistryError(f"etcd at {endpoint} refused {path}: {detail}") from None
            except (urllib.error.URLError, OSError, TimeoutError) as exc:
                reason = getattr(exc, "reason", exc)
                errors.append(f"{endpoint}: {reason}")
                continue
            try:
                answer = json.loads(payload)
            except ValueError:
                raise RegistryError(f"etcd at {endpoint} answered {path} with something that is not JSON") from None
            if not isinstance(answer, dict):
                raise RegistryError(f"etcd at {endpoint} answered {path} with a {type(answer).__name__}")
            if "error" in answer and "result" not in answer:
                raise RegistryError(f"etcd at {endpoint} refused {path}: {answer['error']}")
            return answer
        raise RegistryUnavailable(
            f"no etcd endpoint answered {path} within {timeout:.1f}s ({'; '.join(errors) or 'timed out'})"
        )

    # -- key/value ---------------------------------------------------------------------------------

    def put(self, key: str, value: bytes, *, lease: int = 0) -> None:
        """Write ``key``; with ``lease``, the key disappears when the lease expires or is revoked."""
        body: dict[str, Any] = {"key": _b64(key), "value": _b64(value)}
        if lease:
            body["lease"] = str(lease)
        self.call("/v3/kv/put", body)

    def get_prefix(self, prefix: str) -> dict[str, bytes]:
        """Every key starting with ``prefix`` and its value."""
        raw = prefix.encode()
        answer = self.call("/v3/kv/range", {"key": _b64(raw), "range_end": _b64(_prefix_end(raw))})
        return {_unb64(kv["key"]).decode(errors="replace"): _unb64(kv.get("value", "")) for kv in answer.get("kvs", [])}

    def get(self, key: str) -> bytes | None:
        """The value of ``key``, or None if it does not exist."""
        answer = self.call("/v3/kv/range", {"key": _b64(key)})
        kvs = answer.get("kvs", [])
        return _unb64(kvs[0].get("value", "")) if kvs else None

    def delete(self, key: str) -> int:
        """Delete ``key``; returns how many keys were deleted (0 or 1)."""
        answer = self.call("/v3/kv/deleterange", {"key": _b64(key)})
        return int(answer.get("deleted", 0))

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
        except RegistryUnavailable:
            raise
        except RegistryError as exc:
            if "not found" not in str(exc):
                raise


class Registration:
    """One published rank record and the thread that keeps its lease alive.

    ``renewals`` counts successful keep-alives; ``reregistrations`` counts how often the record was
    written again under a new lease (after etcd lost the old one, e.g. an outage longer than the TTL).
    """

    def __init__(self, client: EtcdClient, key: str, record: bytes, ttl_s: int) -> None:
        self._client = client
        self.key = key
        self.ttl_s = ttl_s
        self._record = record
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self.renewals = 0
        self.reregistrations = 0
        self.last_error = ""
        self.lease = self._publish()
        self._thread = threading.Thread(target=self._keep_alive, name=f"kvpolicy-lease-{key}", daemon=True)
        self._thread.start()

    def _publish(self) -> int:
        lease = self._client.grant(self.ttl_s)
        self._client.put(self.key, self._record, lease=lease)
        return lease

    @property
    def alive(self) -> bool:
        """True until :meth:`close`."""
        return not self._stop.is_set()

    def _keep_alive(self) -> None:
        # A third of the TTL between renewals leaves two more tries before the entry expires.
        interval = max(self.ttl_s / 3.0, 0.2)
        while not self._stop.wait(interval):
            try:
                with self._lock:
                    if self._stop.is_set():
                        return
                    ttl = self._client.keepalive(self.lease)
                    if ttl > 0:
                        self.renewals += 1
                        self.last_error = ""
                        continue
                    self.lease = self._publish()
                    self.reregistrations += 1
                    self.last_error = ""
                    log.warning("registry: lease of %s was lost; record written again", self.key)
            except RegistryError as exc:
                if self.last_error != str(exc):
                    log.warning("registry: could not renew %s: %s", self.key, exc)
                self.last_error = str(exc)

    def close(self, timeout_s: float = 2.0) -> None:
        """Stop renewing and revoke the lease (which deletes the record). Best effort if etcd is down:
        the record then expires by itself within the TTL."""
        if self._stop.is_set():
            return
        self._stop.set()
        with self._lock:
            try:
                self._client.revoke(self.lease, timeout_s=timeout_s)
            except RegistryError as exc:
                log.warning("registry: could not revoke the lease of %s (it expires in %ss): %s", self.key, self.ttl_s, exc)
        self._thread.join(timeout_s)


class EtcdRegistry:
    """Rank records of one deployment (``namespace``) in etcd.

    Args:
        endpoints: etcd client URLs; defaults to nothing, pass e.g. ``os.environ["NIXL_ETCD_ENDPOINTS"]``
            to share NIXL's.
        namespace: separates deployments that share one etcd.
        timeout_s: the limit of each call to etcd.
    """

    def __init__(self, endpoints: str | Sequence[str], *, namespace: str = "default", timeout_s: float = 2.0) -> None:
        if not _NAME.match(namespace):
            raise ValueError(f"namespace {namespace!r} must be 1-128 of [A-Za-z0-9._@:-], not starting with a symbol")
        self.namespace = namespace
        self.client = EtcdClient(endpoints, timeout_s=timeout_s)
        self.prefix = f"/kvpolicy/{namespace}/ranks/"
        self._registrations: dict[str, Registration] = {}
        self._lock = threading.Lock()

    def key(self, name: str) -> str:
        """The etcd key of rank ``name``."""
        if not isinstance(name, str) or not _NAME.match(name):
            raise ValueError(f"rank name {name!r} must be 1-128 of [A-Za-z0-9._@:-], not starting with a symbol")
        return self.prefix + name

    def register(self, name: str, rank_info: Mapping[str, Any], *, ttl_s: int = 10) -> Registration:
        """Publish ``rank_info`` (a JSON-able map) as rank ``name`` under a lease of ``ttl_s`` seconds,
        renewed by a background thread until :meth:`Registration.close` or :meth:`close`.

        Registering a name again replaces the earlier record of this registry.
        """
        if not isinstance(ttl_s, int) or isinstance(ttl_s, bool) or not 1 <= ttl_s <= 3600:
            raise ValueError(f"ttl_s must be an int between 1 and 3600, got {ttl_s!r}")
        key = self.key(name)
        record = json.dumps(dict(rank_info), sort_keys=True).encode()
        if len(record) > _MAX_RECORD:
            raise ValueError(f"rank record of {name!r} is {len(record)} bytes; the limit is {_MAX_RECORD}")
        with self._lock:
            old = self._registrations.pop(name, None)
        if old is not None:
            old.close()
        registration = Registration(self.client, key, record, ttl_s)
        with self._lock:
            self._registrations[name] = registration
        return registration

    def unregister(self, name: str) -> None:
        """Withdraw rank ``name`` if this registry published it."""
        with self._lock:
            registration = self._registrations.pop(name, None)
        if registration is not None:
            registration.close()

    def get(self, name: str) -> dict[str, Any] | None:
        """Rank ``name``'s record now, or None if there is none (raises if etcd is unreachable)."""
        value = self.client.get(self.key(name))
        return None if value is None else self._decode(name, value)

    def lookup(self, name: str, *, timeout_s: float = 10.0, poll_s: float = 0.05) -> dict[str, Any]:
        """Rank ``name``'s record, waiting up to ``timeout_s`` for it to appear.

        Raises ``LookupError`` if it does not appear in time, :class:`RegistryUnavailable` if etcd could
        not be reached during the whole wait.
        """
        deadline = time.monotonic() + timeout_s
        last_error: RegistryUnavailable | None = None
        while True:
            left = deadline - time.monotonic()
            try:
                value = self.client.call(
                    "/v3/kv/range", {"key": _b64(self.key(name))}, timeout_s=max(0.05, min(self.client.timeout_s, left))
                )
                kvs = value.get("kvs", [])
                if kvs:
                    return self._decode(name, _unb64(kvs[0].get("value", "")))
                last_error = None
            except RegistryUnavailable as exc:
                last_error = exc
            if time.monotonic() + poll_s >= deadline:
                if last_error is not None:
                    raise RegistryUnavailable(f"looking up rank {name!r}: {last_error}") from None
                raise LookupError(f"no rank {name!r} registered under {self.prefix} within {timeout_s:.1f}s")
            time.sleep(poll_s)
            poll_s = min(poll_s * 2, 0.5)

    def lookup_address(self, name: str, *, timeout_s: float = 10.0) -> str:
        """The control address (``tcp://host:port``) of rank ``name``, for
        :meth:`NixlTransceiver.connect <kvpolicy.transports.NixlTransceiver.connect>`; waits like
        :meth:`lookup` and raises :class:`RegistryError` if the record has no usable address."""
        record = self.lookup(name, timeout_s=timeout_s)
        address = record.get("address")
        if not isinstance(address, str) or not re.match(r"^tcp://[^\s/]+:\d{1,5}$", address):
            raise RegistryError(f"record of rank {name!r} has no usable control address: {address!r}")
        return address

    def list(self) -> dict[str, dict[str, Any]]:
        """Every rank record of this namespace, by name. Entries that are not valid records are skipped."""
        ranks = {}
        for key, value in self.client.get_prefix(self.prefix).items():
            name = key[len(self.prefix) :]
            try:
                ranks[name] = self._decode(name, value)
            except RegistryError as exc:
                log.warning("registry: skipping %s: %s", key, exc)
        return ranks

    def watch(
        self, on_change: Callable[[dict[str, dict[str, Any]], set[str]], None], *, poll_s: float = 0.5
    ) -> RankWatch:
        """Call ``on_change(appeared_or_changed, gone)`` from a background thread whenever the ranks
        of this namespace change (first with every rank present), until :meth:`RankWatch.stop`.

        It polls :meth:`list` every ``poll_s`` seconds rather than holding an etcd watch stream: a
        stream must be re-established after every etcd outage, a poll simply resumes. While etcd is
        unreachable nothing is reported (``RankWatch.last_error`` says why).
        """
        return RankWatch(self, on_change, poll_s)

    def _decode(self, name: str, value: bytes) -> dict[str, Any]:
        if len(value) > _MAX_RECORD:
            raise RegistryError(f"record of rank {name!r} is {len(value)} bytes, over the {_MAX_RECORD} limit")
        try:
            record = json.loads(value)
        except ValueError:
            raise RegistryError(f"record of rank {name!r} is not JSON") from None
        if not isinstance(record, dict):
            raise RegistryError(f"record of rank {name!r} is a {type(record).__name__}, not a map")
        return record

    def close(self) -> None:
        """Withdraw every rank this registry published."""
        with self._lock:
            registrations = list(self._registrations.values())
            self._registrations.clear()
        for registration in registrations:
            registration.close()

    def __enter__(self) -> EtcdRegistry:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class RankWatch:
    """The thread behind :meth:`EtcdRegistry.watch`."""

    def __init__(
        self,
        registry: EtcdRegistry,
        on_change: Callable[[dict[str, dict[str, Any]], set[str]], None],
        poll_s: float,
    ) -> None:
        if not (0 < poll_s < float("inf")):
            raise ValueError(f"poll_s must be finite and positive, got {poll_s!r}")
        self._registry = registry
        self._on_change = on_change
        self._poll_s = poll_s
        self._stop = threading.Event()
        self.last_error = ""
        self._thread = threading.Thread(target=self._run, name=f"kvpolicy-watch-{registry.namespace}", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        known: dict[str, dict[str, Any]] = {}
        while not self._stop.is_set():
            try:
                ranks = self._registry.list()
            except RegistryError as exc:
                self.last_error = str(exc)
            else:
                self.last_error = ""
                changed = {name: record for name, record in ranks.items() if known.get(name) != record}
                gone = set(known) - set(ranks)
                known = ranks
                if changed or gone:
                    try:
                        self._on_change(changed, gone)
                    except Exception:  # a faulty callback must not end the watch
                        log.exception("registry: watch callback failed")
            self._stop.wait(self._poll_s)

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stop watching; returns once the thread has ended (or after ``timeout_s``)."""
        self._stop.set()
        self._thread.join(timeout_s)
