"""Finding peers through etcd: rank records under a namespaced key, kept alive by a lease, rewritten
as a heartbeat and guarded by a compare-and-swap.

A sender publishes where it listens with :meth:`EtcdRegistry.register`; receivers find it by name with
:meth:`EtcdRegistry.lookup`. A record (:class:`RankRecord`) holds only what a decoder needs before it
connects: the control address and the sender's CURVE public key. Nothing that grants access to memory
(NIXL agent metadata, pool addresses, remote keys, layouts) is published: that travels inside the
authenticated control plane. Each record lives under ``/kvpolicy/<namespace>/ranks/<name>`` on a lease
that a background thread keeps alive, so the entry of a worker that dies expires after ``ttl_s``.

Liveness does not rest on the lease alone: etcd 3.4 checks no permission on lease keep-alive and any
reader sees a record's lease id, so even a read-only user can keep a dead sender's entry in etcd.
The record itself beats instead. Its stored value promises ``"ttl_s": N`` beside the fields, and the
sender's thread rewrites it every ``ttl_s/3`` (a new ``mod_revision`` each time), which only a
writer of the key can do. A reader remembers, on its own monotonic clock, when it first saw each
record's ``mod_revision``; a record unchanged for longer than the ``ttl_s`` it promises is ``stale``:
:meth:`~EtcdRegistry.lookup` skips it and keeps waiting, :meth:`~EtcdRegistry.list` leaves it out
(and :meth:`~EtcdRegistry.watch` reports the rank gone). A record without ``ttl_s`` (an older sender)
is never judged stale, and one a reader sees for the first time is not known stale: the CURVE
handshake of ``connect()`` is what proves the process there alive.

Why a decoder can trust what it reads: (1) etcd serves TLS only, asks for client certificates, and
its auth lets only the transceivers' role touch ``/kvpolicy/``; (2) each keep-alive round rewrites
the record in one transaction that checks its ``mod_revision`` is still its own write, and writes it
back if anyone else changed or deleted it (:attr:`Registration.restorations`); (3) a reader accepts only
records naming a key in its ``trusted_keys``, and the CURVE handshake to that address then succeeds
only if the process there holds the matching secret key. The key checked is the key ``connect()``
uses: an address that carries a key (``tcp://HEX@host:port``) must carry the record's ``public_key``,
or the record is refused (:class:`InvalidRecord`, reason ``key-mismatch``). A forged or garbled record
can delay a decoder until its owner restores it, never redirect it, and never hides the records of
other names. The README ("etcd with TLS and auth") walks through it.

The client speaks etcd's v3 gRPC-JSON gateway with the standard library
(:mod:`~kvpolicy.transports.etcd_client`). Every call has a finite timeout; an unreachable etcd raises
:class:`RegistryUnavailable`, a refusal :class:`RegistryDenied`. A registration survives an etcd
outage: its keep-alive retries, and if the lease was lost it grants a new one and writes the record again.

The roles live in their own modules, and every name is importable from here: :mod:`.records` (the
record, its stored form and how a stored value is checked), :mod:`.registration` (the writer's
keep-alive thread), :mod:`.liveness` (a reader's staleness clocks) and
:mod:`~kvpolicy.transports.etcd_client` (the client). This module is the reader: :class:`EtcdRegistry`
and :class:`RankWatch`.
"""

from __future__ import annotations

import logging
import os
import re
import threading
import time
from collections import Counter
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any

from .etcd_client import (
    EtcdClient,
    EtcdSecurity,
    RegistryDenied,
    RegistryError,
    RegistryUnavailable,
    b64,
    prefix_end,
    unb64,
)
from .liveness import Sightings, check_fresh, mod_revision
from .records import MAX_TTL, InvalidRecord, KeyMismatch, RankRecord, address_key, read_stored, short_key
from .registration import Registration

log = logging.getLogger("kvpolicy.transports")

__all__ = [  # the client's, the record's and the writer's names too: callers import them from here
    "EtcdClient", "EtcdRegistry", "EtcdSecurity", "InvalidRecord", "KeyMismatch", "RankRecord", "RankWatch",
    "Registration", "RegistryDenied", "RegistryError", "RegistryUnavailable", "address_key", "nixl_metadata_key",
]  # fmt: skip

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._@:-]{0,127}$")
#: When one range of the whole prefix cannot be read (oversized values push the answer past the
#: client's limit), :meth:`EtcdRegistry.list` reads it one key at a time, at most this many keys.
_MAX_WALK = 4096


def nixl_metadata_key(agent: str) -> str:
    """The etcd key under which NIXL's ``send_local_metadata()`` stores agent ``agent``'s metadata
    (``NIXL_ETCD_NAMESPACE``, default ``/nixl/agents/``, then ``/<agent>/metadata``). NIXL 1.5 writes
    it with a client of its own that has neither TLS nor etcd users: such an etcd hands one-sided
    access to anyone who can reach it. Deployments carry the metadata over the control plane."""
    return f"{os.environ.get('NIXL_ETCD_NAMESPACE', '/nixl/agents/')}/{agent}/metadata"


def _log_token(exc: InvalidRecord) -> str:
    # A stale record's message counts the seconds: log it once per name, not once per poll.
    return exc.reason if exc.reason == "stale" else str(exc)


class EtcdRegistry:
    """Rank records of one deployment (``namespace``) in etcd.

    Args:
        endpoints: etcd client URLs (``https://host:2379``, comma-separated or a sequence).
        namespace: separates deployments that share one etcd.
        security: TLS and etcd user (:class:`EtcdSecurity`); None reads ``KVPOLICY_ETCD_*`` from the
            environment (:meth:`EtcdSecurity.from_env`).
        timeout_s: the limit of each call to etcd.
        allowed: the reader's allow-list (an :class:`~kvpolicy.transports.keys.AllowList`, or what
            ``AllowList`` takes: the ``allowed_peers`` folder). With it every :meth:`lookup` binds a
            name to its key: the record of ``prefill-0`` is followed only if it carries the key the
            allow-list names ``prefill-0``. Without it, only ``trusted_keys`` (if given) limit a lookup.
    """

    def __init__(
        self,
        endpoints: str | Sequence[str],
        *,
        namespace: str = "default",
        security: EtcdSecurity | None = None,
        timeout_s: float = 2.0,
        allowed: Any = None,
    ) -> None:
        if allowed is not None and not hasattr(allowed, "key_of"):
            from .keys import AllowList

            allowed = AllowList(allowed)
        self.allowed = allowed
        if not _NAME.match(namespace):
            raise ValueError(f"namespace {namespace!r} must be 1-128 of [A-Za-z0-9._@:-], not starting with a symbol")
        self.namespace = namespace
        self.client = EtcdClient(endpoints, security=security, timeout_s=timeout_s)
        self.prefix = f"/kvpolicy/{namespace}/ranks/"
        self._registrations: dict[str, Registration] = {}
        self._lock = threading.Lock()
        #: How often a record read from etcd was refused (by :meth:`lookup` or :meth:`list`), by
        #: :attr:`InvalidRecord.reason`: ``key-mismatch``, ``untrusted``, ``not-json``, ...
        self.skipped: Counter[str] = Counter()
        #: The entries the latest :meth:`list` skipped: rank name -> why.
        self.last_skipped: dict[str, str] = {}
        self._logged_skips: dict[str, str] = {}  # what list() last logged per name (_log_token)
        self._sightings = Sightings()

    def key(self, name: str) -> str:
        """The etcd key of rank ``name``."""
        if not isinstance(name, str) or not _NAME.match(name):
            raise ValueError(f"rank name {name!r} must be 1-128 of [A-Za-z0-9._@:-], not starting with a symbol")
        return self.prefix + name

    def register(self, name: str, record: RankRecord | Mapping[str, Any], *, ttl_s: int = 10) -> Registration:
        """Publish ``record`` as rank ``name`` under a lease of ``ttl_s`` seconds, kept alive and
        checked by a background thread until :meth:`Registration.close` or :meth:`close`.

        A map (e.g. a transceiver's ``rank_record()``) is reduced to :meth:`RankRecord.from_mapping`:
        only the address and public key are published. Registering a name again replaces the
        earlier record of this registry.
        """
        if not isinstance(ttl_s, int) or isinstance(ttl_s, bool) or not 1 <= ttl_s <= MAX_TTL:
            raise ValueError(f"ttl_s must be an int between 1 and {MAX_TTL}, got {ttl_s!r}")
        key = self.key(name)
        if not isinstance(record, RankRecord):
            record = RankRecord.from_mapping(record)
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

    def get(self, name: str) -> RankRecord | None:
        """Rank ``name``'s record now, or None if there is none (raises if etcd is unreachable). One
        read: it neither judges staleness nor checks keys, as :meth:`lookup` does."""
        value = self.client.get(self.key(name))
        return None if value is None else RankRecord.parse(name, value)

    def lookup(
        self,
        name: str,
        *,
        timeout_s: float = 10.0,
        trusted_keys: Collection[str] | None = None,
        allowed: Any = None,
        poll_s: float = 0.05,
    ) -> RankRecord:
        """Rank ``name``'s record, waiting up to ``timeout_s`` for it to appear.

        What is stored under the name but is not a valid record (not JSON, wrong types, too large,
        an address whose key is not its ``public_key``) is skipped: the lookup logs it, counts it in
        :attr:`skipped` and keeps waiting, since the owner's keep-alive restores a replaced record.
        With ``trusted_keys`` (Z85 CURVE public keys of the senders this decoder may use), a record
        whose key (the one its address carries, which ``connect()`` uses; else ``public_key``) is
        not among them, or that names none, is skipped the same way. If that is all it saw until
        the timeout it raises :class:`InvalidRecord` naming the problem; ``LookupError`` if no
        record appeared at all, :class:`RegistryUnavailable` if etcd could not be reached during the
        whole wait, :class:`RegistryDenied` at once if etcd refuses us. Other names are never read.

        With ``allowed`` (the decoder's allow-list, an :class:`~kvpolicy.transports.keys.AllowList` or
        anything with its ``key_of(name)``), a name is bound to its key: since a sender is named by its
        key's allow-list name, the record of ``name`` must carry the key the allow-list names ``name``.
        Any other record (a holder of another sender's key, or of the shared prefill etcd user, writing
        its own key under this name) is skipped with reason ``name-key-mismatch`` and counted, and the
        lookup keeps waiting for the honest record; a name the allow-list lacks is skipped as
        ``name-not-allowed``. ``trusted_keys`` still applies on top: it never widens what a name may carry.

        A record that promises ``ttl_s`` (every :class:`Registration` writes one) and whose
        ``mod_revision`` this registry has seen unchanged for longer than that, on its own monotonic
        clock (in this lookup, an earlier one, :meth:`list` or :meth:`watch`), is skipped as
        ``stale``: its sender stopped rewriting it, though its lease may be kept alive by anyone who
        reads the lease id. The lookup keeps waiting (a sender back from a pause or an etcd outage
        beats again within ``ttl_s/3``, and is then returned) and raises :class:`InvalidRecord` with
        reason ``stale`` at its timeout. When etcd does not answer this registry, every such clock
        starts again at the next sighting: a sender cut off from etcd could not beat either. A
        record seen for the first time is not known stale and is returned: the CURVE handshake of
        ``connect()`` proves the process there alive. A record without ``ttl_s`` (an older sender,
        or one written by hand) is never judged stale.
        """
        key = self.key(name)
        trusted = None if trusted_keys is None else frozenset(trusted_keys)
        allowed = self.allowed if allowed is None else allowed
        deadline = time.monotonic() + timeout_s
        last_error: RegistryError | None = None
        refused: InvalidRecord | None = None  # the latest record skipped (kept across a failed read)
        logged: set[str] = set()
        while True:
            asked = time.monotonic()
            left = deadline - asked
            try:
                value = self.client.call("/v3/kv/range", {"key": b64(key)}, timeout_s=max(0.05, min(self.client.timeout_s, left)))
            except RegistryUnavailable as exc:
                last_error = exc
                self._sightings.outage()
            else:
                answered = time.monotonic()
                kvs = value.get("kvs", [])
                last_error = refused = None
                if not kvs:
                    self._sightings.forget(name)
                else:
                    age = self._sightings.age(name, mod_revision(kvs[0]), asked=asked, answered=answered)
                    try:
                        record, ttl = read_stored(name, unb64(kvs[0].get("value", "")))
                        if allowed is not None:
                            self._check_named(name, record, allowed)
                        if trusted is not None:
                            self._check_trusted(name, record, trusted)
                        check_fresh(name, ttl, age)
                        return record
                    except InvalidRecord as exc:
                        last_error = refused = exc
                        self._skip(name, exc, warn=_log_token(exc) not in logged)
                        logged.add(_log_token(exc))
            now = time.monotonic()
            if now >= deadline:
                if refused is not None:  # even if the last read failed: what was found is the problem
                    raise InvalidRecord(
                        f"no usable record of rank {name!r} within {timeout_s:.1f}s; the one stored was skipped: {refused}",
                        refused.reason,
                    ) from None
                if isinstance(last_error, RegistryUnavailable):
                    raise RegistryUnavailable(f"looking up rank {name!r}: {last_error}") from None
                if last_error is not None:
                    raise last_error
                raise LookupError(f"no rank {name!r} registered under {self.prefix} within {timeout_s:.1f}s")
            time.sleep(min(poll_s, deadline - now))  # the last read is at the deadline
            poll_s = min(poll_s * 2, 0.5)

    @staticmethod
    def _check_named(name: str, record: RankRecord, allowed: Any) -> None:
        """The record of ``name`` carries the key the allow-list names ``name`` (read on every look:
        a key file replaced under the same name is followed at once)."""
        expected = allowed.key_of(name)
        if expected is None:
            raise InvalidRecord(
                f"record of rank {name!r}: the allow-list names no key {name!r}, so no record of that name can be "
                f"followed (add {name}.key to allowed_peers if it is a sender you use)",
                "name-not-allowed",
            )
        wanted = expected.decode() if isinstance(expected, bytes) else str(expected)
        key = record.address_key or record.public_key
        if key != wanted or record.public_key != wanted:
            raise InvalidRecord(
                f"record of rank {name!r} carries key {short_key(key) if key else '(none)'}, but the allow-list's "
                f"{name}.key is {short_key(wanted)}: a record written under another sender's name (skipped; waiting "
                "for the honest one)",
                "name-key-mismatch",
            )

    @staticmethod
    def _check_trusted(name: str, record: RankRecord, trusted: frozenset[str]) -> None:
        # The key connect() will use: the address's own when it carries one. RankRecord already
        # refused a record whose public_key differs from it; this check does not rely on that.
        key = record.address_key
        if key is None:
            key = record.public_key
        elif record.public_key != key:
            raise InvalidRecord(f"record of rank {name!r}: its address and public_key name different keys", "key-mismatch")
        if key not in trusted:
            raise InvalidRecord(
                f"record of rank {name!r} names public key {short_key(key) if key else '(none)'}, which is not among the "
                f"{len(trusted)} trusted sender keys: a forged record, or a sender whose key you did not allow",
                "untrusted",
            )

    def _skip(self, name: str, exc: InvalidRecord, *, warn: bool) -> None:
        with self._lock:
            self.skipped[exc.reason] += 1
        if warn:
            log.warning("registry: skipping the record of %r under %s (%s): %s", name, self.prefix, exc.reason, exc)

    def lookup_address(self, name: str, *, timeout_s: float = 10.0, trusted_keys: Collection[str] | None = None, allowed: Any = None) -> str:
        """The control address (``tcp://host:port``) of rank ``name``, for
        :meth:`NixlTransceiver.connect <kvpolicy.transports.NixlTransceiver.connect>`; waits and
        checks like :meth:`lookup`."""
        return self.lookup(name, timeout_s=timeout_s, trusted_keys=trusted_keys, allowed=allowed).address

    def list(self) -> dict[str, RankRecord]:
        """Every rank record of this namespace, by name. Entries that are not valid records (or whose
        key is no rank name) are skipped: counted in :attr:`skipped`, listed in :attr:`last_skipped`
        and logged once per problem. So are ``stale`` records: one that promises ``ttl_s`` and whose
        ``mod_revision`` this registry has seen unchanged for longer (see :meth:`lookup`; a record seen
        for the first time, or one without ``ttl_s``, is never stale). If values too large for one
        answer fill the prefix, it is read one key at a time, so such entries never hide the others."""
        asked = time.monotonic()
        try:
            entries = self._entries()
        except RegistryUnavailable:
            self._sightings.outage()
            raise
        answered = time.monotonic()
        names = {key[len(self.prefix) :]: entry for key, entry in entries.items()}
        self._sightings.keep(names)
        ranks: dict[str, RankRecord] = {}
        skipped: dict[str, str] = {}
        logged: dict[str, str] = {}
        for name, entry in names.items():
            try:
                if not _NAME.match(name):
                    raise InvalidRecord(f"key {self.prefix + name!r} under {self.prefix} names no rank", "bad-name")
                age = self._sightings.age(name, mod_revision(entry), asked=asked, answered=answered)
                record, ttl = read_stored(name, unb64(entry.get("value", "")))
                check_fresh(name, ttl, age)
                ranks[name] = record
            except InvalidRecord as exc:
                skipped[name] = str(exc)
                logged[name] = _log_token(exc)
                self._skip(name, exc, warn=self._logged_skips.get(name) != logged[name])
        self.last_skipped = skipped
        self._logged_skips = logged
        return ranks

    def _entries(self) -> dict[str, dict[str, Any]]:
        """The prefix's entries (the gateway's, with ``mod_revision``), in one answer if they fit."""
        try:
            return self.client.get_prefix_entries(self.prefix)
        except (RegistryUnavailable, RegistryDenied):
            raise
        except RegistryError as exc:
            log.warning("registry: could not read %s in one answer (%s); reading it key by key", self.prefix, exc)
            return self._walk()

    def _walk(self) -> dict[str, dict[str, Any]]:
        """The prefix's entries, one range call per key (an entry always fits in one answer)."""
        start, end = self.prefix.encode(), prefix_end(self.prefix.encode())
        entries: dict[str, dict[str, Any]] = {}
        for _ in range(_MAX_WALK):
            answer = self.client.call("/v3/kv/range", {"key": b64(start), "range_end": b64(end), "limit": 1})
            kvs = answer.get("kvs", [])
            if not kvs:
                return entries
            raw = unb64(kvs[0].get("key", ""))
            entries[raw.decode(errors="replace")] = kvs[0]
            if not answer.get("more"):
                return entries
            start = raw + b"\0"  # the next key after this one
        log.warning("registry: %s holds more than %d keys; read the first %d", self.prefix, _MAX_WALK, _MAX_WALK)
        return entries

    def watch(self, on_change: Callable[[dict[str, RankRecord], set[str]], None], *, poll_s: float = 0.5) -> RankWatch:
        """Call ``on_change(appeared_or_changed, gone)`` from a background thread whenever the ranks
        of this namespace change (first with every rank present), until :meth:`RankWatch.stop`.

        It polls :meth:`list` every ``poll_s`` seconds rather than holding an etcd watch stream: a
        stream must be re-established after every etcd outage, a poll simply resumes. While etcd is
        unreachable nothing is reported (``RankWatch.last_error`` says why).

        A rank whose record went ``stale`` (not rewritten for longer than the ``ttl_s`` it promises:
        its sender is dead or paused, whoever keeps its lease alive) is reported gone within about
        ``ttl_s + poll_s`` of its last beat, though its key may still be in etcd; it is reported
        again (in ``appeared_or_changed``) if it beats again.
        """
        return RankWatch(self, on_change, poll_s)

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
        on_change: Callable[[dict[str, RankRecord], set[str]], None],
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
        known: dict[str, RankRecord] = {}
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
