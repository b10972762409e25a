"""A rank record and its stored form: what a sender publishes about itself (:class:`RankRecord`: its
control address and CURVE public key), the value a registration stores in etcd (the record's fields
and the ``ttl_s`` it promises, :func:`stored_value`), and how a stored value is read and checked
(:func:`read_stored`, :class:`InvalidRecord`). The writer of a record is :mod:`.registration`; its
readers, :mod:`.discovery`."""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .addresses import split_address
from .etcd_client import RegistryError

__all__ = ["InvalidRecord", "KeyMismatch", "RankRecord", "address_key"]

_ADDRESS = re.compile(r"^tcp://[^\s/]{1,253}:(\d{1,5})$")
#: A CURVE public key as ZeroMQ prints it: 40 characters of Z85.
_Z85_KEY = re.compile(r"^[0-9a-zA-Z.:+=^!/*?&<>()\[\]{}@%$#-]{40}$")
#: A record is a small JSON map; anything larger in the store is not ours and is refused.
_MAX_RECORD = 4 << 10
#: The longest lease, and so the longest beat a stored record may promise (``ttl_s``).
MAX_TTL = 3600


class InvalidRecord(RegistryError):
    """What is stored under a rank's key is not a record this registry accepts. ``reason`` says why
    in one word (``too-large``, ``not-json``, ``not-a-map``, ``invalid``, ``key-mismatch``,
    ``bad-name``, ``untrusted``, ``name-key-mismatch``, ``name-not-allowed``, ``stale``); the message
    names the rank and the problem."""

    def __init__(self, message: str, reason: str) -> None:
        super().__init__(message)
        self.reason = reason


class KeyMismatch(ValueError):
    """A rank address carries one CURVE key and the record's ``public_key`` names another."""


def address_key(address: str) -> str | None:
    """The CURVE public key (Z85) that a control address carries, as ``connect()`` reads it
    (:func:`~kvpolicy.transports.addresses.split_address`), or None; ``ValueError`` if the part before
    ``@`` is not a 32-byte key in hex."""
    _, key = split_address(address)
    return None if key is None else key.decode("ascii")


def short_key(key: str) -> str:
    """A short name of a CURVE public key (Z85) for messages: the first 16 hex digits of its SHA-256."""
    return hashlib.sha256(key.encode()).hexdigest()[:16]


@dataclass(frozen=True)
class RankRecord:
    """What a sender publishes about itself: ``address``, where its control socket listens
    (``tcp://host:port``, or ``tcp://HEX@host:port`` carrying its key as a transceiver's ``address``
    does), and ``public_key``, the CURVE public key (Z85, 40 characters) it proves in the control-plane
    handshake. Nothing else: no agent metadata, pool address or remote key.

    ``connect()`` uses the key the address carries, so when it carries one, ``public_key`` must be
    that same key (``KeyMismatch``, a ``ValueError``, otherwise) and is filled from it when omitted:
    the key a reader checks is always the key it will connect with."""

    address: str
    public_key: str | None = None

    def __post_init__(self) -> None:
        match = _ADDRESS.match(self.address) if isinstance(self.address, str) else None
        if match is None or not 0 < int(match.group(1)) < 65536:
            raise ValueError(f"rank address {self.address!r} must be tcp://host:port")
        if self.public_key is not None and not (isinstance(self.public_key, str) and _Z85_KEY.match(self.public_key)):
            raise ValueError("rank public_key must be a CURVE public key in Z85 (40 characters), as `kvpolicy keys` writes")
        try:
            carried = address_key(self.address)
        except ValueError as exc:
            raise ValueError(f"rank {exc}") from None
        if carried is None:
            return
        if self.public_key is None:
            object.__setattr__(self, "public_key", carried)
        elif self.public_key != carried:
            raise KeyMismatch(
                f"rank address carries public key {short_key(carried)} but public_key names {short_key(self.public_key)}: "
                "connect() would use the address's key, not the one checked (a forged record?)"
            )

    @property
    def address_key(self) -> str | None:
        """The CURVE public key (Z85) the address carries, which ``connect()`` uses, or None."""
        return address_key(self.address)

    @property
    def fingerprint(self) -> str:
        """A short name of the public key for logs (first 16 hex digits of its SHA-256), or ''."""
        return hashlib.sha256(self.public_key.encode()).hexdigest()[:16] if self.public_key else ""

    @classmethod
    def from_mapping(cls, info: Mapping[str, Any]) -> RankRecord:
        """The publishable part of ``info`` (e.g. a transceiver's ``rank_record()``): its
        ``address`` and ``public_key``; every other field stays private."""
        if not isinstance(info, Mapping):
            raise ValueError(f"a rank record is a map with an 'address', not a {type(info).__name__}")
        return cls(info.get("address"), info.get("public_key"))  # type: ignore[arg-type]  # __post_init__ checks both fields and raises a ValueError naming the bad one

    def to_json(self) -> bytes:
        """The bytes stored in etcd."""
        fields = {"address": self.address} if self.public_key is None else {"address": self.address, "public_key": self.public_key}
        return json.dumps(fields, sort_keys=True).encode()

    @classmethod
    def parse(cls, name: str, value: bytes) -> RankRecord:
        """Read a stored record; raises :class:`InvalidRecord` (a :class:`RegistryError`) naming the
        rank and saying why if it is not one. The ``ttl_s`` a registration stores beside the fields
        (:class:`~.registration.Registration`) is not part of the record, but a stored one must be valid too."""
        return read_stored(name, value)[0]


def read_stored(name: str, value: bytes) -> tuple[RankRecord, int | None]:
    """A stored record and the ``ttl_s`` it promises (None if it promises none: an older sender,
    or a value written by hand), or :class:`InvalidRecord`."""
    if len(value) > _MAX_RECORD:
        raise InvalidRecord(f"record of rank {name!r} is {len(value)} bytes, over the {_MAX_RECORD} limit", "too-large")
    try:
        data = json.loads(value)
    except (ValueError, RecursionError):
        raise InvalidRecord(f"record of rank {name!r} is not JSON", "not-json") from None
    if not isinstance(data, dict):
        raise InvalidRecord(f"record of rank {name!r} is a {type(data).__name__}, not a map", "not-a-map")
    try:
        record = RankRecord.from_mapping(data)
    except KeyMismatch as exc:
        raise InvalidRecord(f"record of rank {name!r}: {exc}", "key-mismatch") from None
    except ValueError as exc:
        raise InvalidRecord(f"record of rank {name!r}: {exc}", "invalid") from None
    if "ttl_s" not in data:
        return record, None
    ttl = data["ttl_s"]
    if not isinstance(ttl, int) or isinstance(ttl, bool) or not 1 <= ttl <= MAX_TTL:
        raise InvalidRecord(
            f"record of rank {name!r}: ttl_s (the seconds after which it may be judged dead if unchanged) must be an int "
            f"between 1 and {MAX_TTL}, not {repr(ttl)[:40]}",
            "invalid",
        )
    return record, ttl


def stored_value(record: RankRecord, ttl_s: int) -> bytes:
    """What a registration writes: the record's fields and the beat it promises, ``ttl_s``."""
    fields = json.loads(record.to_json())
    fields["ttl_s"] = ttl_s
    return json.dumps(fields, sort_keys=True).encode()
