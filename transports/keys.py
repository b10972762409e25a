"""Key material of the control plane: this side's CURVE key pair and the peers it allows.

Every transceiver has an :class:`Identity` (a CURVE key pair with a name) and an :class:`AllowList`
of the public keys it will talk to. Both come from files in ZeroMQ's certificate format, made by
``kvpolicy keys new DIR --name NAME`` (``NAME.key`` is public and may be copied to peers,
``NAME.key_secret`` holds the secret key and stays on its host), or from values in memory.

A peer's *name* is the name of its key as the allow-list knows it (the file stem for a directory):
that is the identity an offer names (``send(..., to=NAME)``), so a scheduler names receivers by keys
an operator installed, never by what a peer claims about itself.
"""

from __future__ import annotations

import hashlib
import os
import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Union

_REREAD_S = 1.0
"""A directory allow-list is read again on an unknown key when the directory changed, or at most
this often otherwise (keys added by an operator are picked up without a restart; a flood of
strangers costs a ``stat`` each and one directory read a second)."""


class KeyMaterialError(ValueError):
    """Key material that cannot be used; the message names the file and how to make a good one."""


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


def _check_z85_key(key: bytes | str, where: str) -> bytes:
    raw = key.encode() if isinstance(key, str) else bytes(key)
    if len(raw) != 40:
        raise KeyMaterialError(f"{where}: a CURVE key is 40 z85 characters, got {len(raw)}")
    try:
        _z85().decode(raw)
    except Exception:
        raise KeyMaterialError(f"{where}: not z85 text") from None
    return raw


def _read_certificate(path: Path) -> tuple[bytes, bytes | None]:
    import zmq.auth

    try:
        public, secret = zmq.auth.load_certificate(str(path))
    except (OSError, ValueError) as exc:
        raise KeyMaterialError(
            f"{path}: not a readable CURVE certificate ({exc}); make one with `kvpolicy keys new DIR --name NAME`"
        ) from None
    if public is None:
        raise KeyMaterialError(f"{path}: no public-key line; make one with `kvpolicy keys new DIR --name NAME`")
    return _check_z85_key(public, str(path)), secret


@dataclass(frozen=True)
class Identity:
    """This side's CURVE key pair (z85 bytes) and the name peers know it by."""

    name: str
    public: bytes
    secret: bytes = field(repr=False)

    @property
    def fingerprint(self) -> str:
        """:func:`fingerprint` of the public key; it is part of this side's NIXL agent name."""
        return fingerprint(self.public)

    @classmethod
    def generate(cls, name: str = "ephemeral") -> Identity:
        """A fresh key pair that lives only in memory (peers must be given :attr:`public`)."""
        import zmq

        public, secret = zmq.curve_keypair()
        return cls(name, public, secret)

    @classmethod
    def load(cls, spec: IdentitySpec) -> Identity:
        """From an :class:`Identity`, a ``NAME.key_secret`` file, or a ``(public, secret)`` pair."""
        if isinstance(spec, Identity):
            return spec
        if spec is None:
            return cls.generate()
        if isinstance(spec, (str, os.PathLike)):
            path = Path(spec)
            public, secret = _read_certificate(path)
            if secret is None:
                raise KeyMaterialError(
                    f"{path}: holds no secret key; pass the NAME.key_secret file made by `kvpolicy keys new`"
                )
            name = path.name.removesuffix(".key_secret").removesuffix(".key")
            return cls(name, public, _check_z85_key(secret, str(path)))
        if isinstance(spec, tuple) and len(spec) == 2:
            public = _check_z85_key(spec[0], "identity public key")
            return cls(fingerprint(public), public, _check_z85_key(spec[1], "identity secret key"))
        raise TypeError(f"identity must be a NAME.key_secret path, an Identity or a (public, secret) pair, got {spec!r}")


IdentitySpec = Union[Identity, str, os.PathLike, tuple, None]


class AllowList:
    """The public keys this side talks to, each with a name.

    Made from a directory of ``NAME.key`` files (read again, at most once a second, when an unknown
    key shows up), a mapping ``{name: public_key}``, or an iterable of public keys, ``.key`` file
    paths and :class:`Identity` objects. Thread-safe.
    """

    def __init__(self, spec: Any) -> None:
        self._lock = threading.Lock()
        self._directory: Path | None = None
        self._keys: dict[bytes, str] = {}
        self._read_at = 0.0
        self._mtime = 0
        if spec is None:
            raise KeyMaterialError(
                "allowed_peers is required: the control plane talks only to peers whose public keys it "
                "knows. Make keys with `kvpolicy keys new DIR --name NAME` on each host, copy the NAME.key "
                "files into one directory, and pass allowed_peers=DIR"
            )
        if isinstance(spec, (str, os.PathLike)) and Path(spec).is_dir():
            self._directory = Path(spec)
            self._read_directory()
        elif isinstance(spec, Mapping):
            for name, key in spec.items():
                self._keys[_check_z85_key(key, f"allowed_peers[{name!r}]")] = str(name)
        elif isinstance(spec, (str, os.PathLike)) and Path(spec).is_file():
            self._add_file(Path(spec))
        elif isinstance(spec, Iterable) and not isinstance(spec, (str, bytes)):
            for item in spec:
                if isinstance(item, Identity):
                    self._keys[item.public] = item.name
                elif isinstance(item, (str, os.PathLike)) and Path(item).is_file():
                    self._add_file(Path(item))
                else:
                    key = _check_z85_key(item, "allowed_peers entry")
                    self._keys[key] = fingerprint(key)
        else:
            raise KeyMaterialError(f"allowed_peers {spec!r}: not a directory, a .key file, a mapping or a list of keys")

    def _add_file(self, path: Path) -> None:
        public, _ = _read_certificate(path)
        self._keys[public] = path.name.removesuffix(".key_secret").removesuffix(".key")

    def _read_directory(self) -> None:
        assert self._directory is not None
        if not self._directory.is_dir():
            self._read_at = time.monotonic()
            return  # gone (or unmounted): keep what was read; a stranger stays a stranger
        keys: dict[bytes, str] = {}
        self._mtime = self._directory_mtime()
        for path in sorted(self._directory.glob("*.key")):
            try:
                public, _ = _read_certificate(path)
            except KeyMaterialError:
                continue  # a half-written file is picked up on the next read
            keys[public] = path.stem
        self._keys = keys
        self._read_at = time.monotonic()

    def _directory_mtime(self) -> int:
        try:
            return os.stat(self._directory).st_mtime_ns if self._directory else 0
        except OSError:
            return 0

    def name_of(self, public: bytes) -> str | None:
        """The name of an allowed key (z85 bytes), or None for a stranger."""
        with self._lock:
            name = self._keys.get(public)
            if name is None and self._directory is not None and (
                self._directory_mtime() != self._mtime or time.monotonic() - self._read_at >= _REREAD_S
            ):
                self._read_directory()
                name = self._keys.get(public)
            return name

    def key_of(self, name_or_key: str) -> bytes | None:
        """The public key named ``name_or_key`` (or that key itself, if allowed)."""
        with self._lock:
            raw = name_or_key.encode()
            if raw in self._keys:
                return raw
            for key, name in self._keys.items():
                if name == name_or_key:
                    return key
            if self._directory is not None:
                self._read_directory()
                for key, name in self._keys.items():
                    if name == name_or_key:
                        return key
        return None

    def __len__(self) -> int:
        with self._lock:
            return len(self._keys)


def create_keys(directory: str | os.PathLike, name: str) -> tuple[Path, Path]:
    """Write ``NAME.key`` (public) and ``NAME.key_secret`` (secret, mode 0600) into ``directory``."""
    import zmq.auth

    if not name or "/" in name or name.startswith(".") or len(name) > 64:
        raise KeyMaterialError(f"key name {name!r}: use 1-64 characters, no '/' and no leading '.'")
    folder = Path(directory)
    folder.mkdir(parents=True, exist_ok=True)
    public, secret = zmq.auth.create_certificates(str(folder), name)
    os.chmod(secret, 0o600)
    return Path(public), Path(secret)


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
    return f"{scheme}://{hostport}", _z85().encode(raw)


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

