"""The writer of a rank record: a :class:`Registration` publishes one record under a lease and keeps
it alive, unchanged and beating from a background thread. Each round refreshes the lease and rewrites
the record in a transaction that checks its ``mod_revision`` first, so the record's own revision is
the sender's heartbeat (readers judge it in :mod:`.liveness`). :meth:`EtcdRegistry.register
<.discovery.EtcdRegistry.register>` creates registrations; what they store is :mod:`.records`'s
:func:`~.records.stored_value`."""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping
from typing import Any

from .etcd_client import EtcdClient, RegistryError, unb64
from .records import RankRecord, stored_value

log = logging.getLogger("kvpolicy.transports")

__all__ = ["Registration"]


class Registration:
    """One published rank record and the thread that keeps it alive, unchanged and beating.

    The stored value is the record's fields and ``"ttl_s": N``, a promise to readers: this record is
    rewritten at least every ``ttl_s/3`` seconds, and one that has not changed for ``ttl_s`` may be
    judged dead. Every keep-alive round (every ``ttl_s/3``) refreshes the lease, then rewrites the
    record in one transaction that first checks its ``mod_revision`` is still this registration's
    latest write. That rewrite is the heartbeat: a lease can be kept alive by anyone who reads its id
    (etcd 3.4 checks no permission on keep-alive), but only a writer of the key can give the record a
    new ``mod_revision``, so a dead sender's record stops changing even while its lease lives
    (:meth:`EtcdRegistry.lookup <.discovery.EtcdRegistry.lookup>` then skips it as ``stale``).

    Counters: ``renewals`` (keep-alive rounds that found the lease alive and the record as written),
    ``reregistrations`` (the lease was lost, e.g. an etcd outage longer than the TTL: a new lease and
    the record again), ``restorations`` (someone else wrote or deleted the record: written back;
    ``last_foreign`` says what was found). ``mod_revision`` is the revision of this registration's
    latest write, which the next round compares against.
    """

    def __init__(self, client: EtcdClient, key: str, record: RankRecord, ttl_s: int) -> None:
        self._client = client
        self.key = key
        self.record = record
        self.ttl_s = ttl_s
        self._value = stored_value(record, ttl_s)
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self.renewals = 0
        self.reregistrations = 0
        self.restorations = 0
        self.last_error = ""
        self.last_foreign = ""
        self.lease, self.mod_revision = self._publish()
        self._thread = threading.Thread(target=self._keep_alive, name=f"kvpolicy-lease-{key}", daemon=True)
        self._thread.start()

    def _publish(self) -> tuple[int, int]:
        lease = self._client.grant(self.ttl_s)
        return lease, self._client.put(self.key, self._value, lease=lease)

    @property
    def alive(self) -> bool:
        """True until :meth:`close`."""
        return not self._stop.is_set()

    def renew(self) -> None:
        """One keep-alive round now: refresh the lease, then rewrite the record (the heartbeat) in a
        transaction that checks it first and, if someone else changed or deleted it, restores it.
        Two etcd calls. Raises :class:`RegistryError` if etcd could not be asked."""
        with self._lock:
            if self._stop.is_set():
                return
            if self._client.keepalive(self.lease) <= 0:
                self.lease, self.mod_revision = self._publish()
                self.reregistrations += 1
                log.warning("registry: lease of %s was lost; record written again", self.key)
                return
            self.mod_revision, found, changed = self._client.rewrite_unless_changed(self.key, self._value, mod_revision=self.mod_revision, lease=self.lease)
            if not changed:
                self.renewals += 1
                return
            self.restorations += 1
            self.last_foreign = _describe(found)
        # Someone with write access to the prefix replaced or deleted this record: a rogue sender or
        # a second process registered under the same name. Readers that check keys never used it.
        log.warning("registry: %s was changed by someone else (%s); written back", self.key, self.last_foreign)

    def _keep_alive(self) -> None:
        # A third of the TTL between rounds leaves two more tries before the entry expires (and
        # before readers judge the record stale), and bounds how long a replaced record stays replaced.
        interval = max(self.ttl_s / 3.0, 0.2)
        while not self._stop.wait(interval):
            try:
                self.renew()
                self.last_error = ""
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


def _describe(entry: Mapping[str, Any] | None) -> str:
    if entry is None:
        return "deleted"
    value = unb64(entry.get("value", ""))[:200].decode("utf-8", "replace")
    return f"value {value!r}, lease {entry.get('lease', '0')}, mod_revision {entry.get('mod_revision', '?')}"
