"""Names and addresses bound to keys: a public key's fingerprint, NIXL agent names that carry it,
control addresses that carry the server's key (``tcp://HEX@host:port``), Z85, and where NIXL may
publish metadata. Pure functions of their arguments; no key files (those are :mod:`.keys`)."""

from __future__ import annotations

import hashlib
from typing import Any

__all__ = ["address_with_key", "agent_carries_key", "check_nixl_etcd", "fingerprint", "split_address", "z85_decode", "z85_encode"]


def _z85() -> Any:
    from zmq.utils import z85

    return z85


def fingerprint(public: bytes) -> str:
    """A short, stable name for a public key (z85 bytes): 12 hex digits of its SHA-256."""
    return hashlib.sha256(public).hexdigest()[:12]


def agent_carries_key(agent: str, key: bytes) -> bool:
    """Whether a NIXL agent name (``NAME-FINGERPRINT-PID-NONCE``, as transceivers make them) carries
    the fingerprint of ``key``: a peer cannot name another peer's agent as its own."""
    parts = agent.rsplit("-", 3)
    return len(parts) == 4 and parts[1] == fingerprint(key)


def address_with_key(endpoint: str, public: bytes) -> str:
    """A control address that carries the server's public key as its user part:
    ``tcp://HEX@host:port`` (HEX: the 32-byte key in hex). ZMQ never sees the key part."""
    scheme, sep, rest = endpoint.partition("://")
    if not sep:
        raise ValueError(f"endpoint {endpoint!r} is not scheme://host:port")
    return f"{scheme}://{_z85().decode(public).hex()}@{rest}"


def split_address(address: str) -> tuple[str, bytes | None]:
    """``(endpoint, public key as z85 bytes or None)`` of an address made by :func:`address_with_key`."""
    scheme, sep, rest = address.partition("://")
    key, at, hostport = rest.rpartition("@")
    if not sep or not at:
        return address, None
    try:
        raw = bytes.fromhex(key)
    except ValueError:
        raise ValueError(f"address {address!r}: the part before '@' must be the sender's public key in hex") from None
    if len(raw) != 32:
        raise ValueError(f"address {address!r}: the key before '@' must be 32 bytes (64 hex digits)")
    return f"{scheme}://{hostport}", z85_encode(raw)


_Z85_CHARS = b"0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.-:+=^!/*?&<>()[]{}@%$#"


def z85_decode(text: bytes) -> bytes:
    """The bytes of Z85 text (pyzmq's decoder; raises on text that is not Z85)."""
    return _z85().decode(text)


def z85_encode(raw: bytes) -> bytes:
    """ZeroMQ's Z85 (RFC 32) of ``raw`` (a multiple of 4 bytes): pyzmq's where it is installed; the
    same text without it (discovery runs on hosts that have no transfer extra)."""
    try:
        return _z85().encode(raw)
    except ImportError:
        out = bytearray()
        for i in range(0, len(raw), 4):
            value = int.from_bytes(raw[i : i + 4], "big")
            out.extend(_Z85_CHARS[value // 85**k % 85] for k in (4, 3, 2, 1, 0))
        return bytes(out)


def check_nixl_etcd(endpoints: str) -> None:
    """metadata='etcd' publishes NIXL metadata (pool address, remote key) through NIXL's own etcd
    client, which has neither TLS nor authentication: allowed only against a loopback etcd."""
    from urllib.parse import urlsplit

    urls = [u.strip() for u in endpoints.split(",") if u.strip()]
    if not urls:
        raise ValueError("metadata='etcd' needs NIXL_ETCD_ENDPOINTS (etcd client URLs) in the environment")
    for url in urls:
        host = urlsplit(url).hostname or ""
        if not (host == "localhost" or host.startswith("127.") or host == "::1"):
            raise ValueError(
                f"metadata='etcd' would publish NIXL remote keys to {url} in plain text (NIXL's etcd client has no "
                "TLS or users); use metadata='inline' (the default: metadata travels in the authenticated, encrypted "
                "hello) and the registry's TLS etcd for rank records"
            )
