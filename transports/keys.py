"""Key material of the control plane: this side's CURVE key pair and the peers it allows.

Every transceiver has an :class:`Identity` (a CURVE key pair with a name) and an :class:`AllowList`
of the public keys it will talk to. Both come from files in ZeroMQ's certificate format, made by
``kvpolicy keys new DIR --name NAME --role ROLE`` (``NAME.key`` is public and may be copied to
peers, ``NAME.key_secret`` holds the secret key and stays on its host), or from values in memory.

A peer's *name* is the name of its key as the allow-list knows it (the file stem for a directory):
that is the identity an offer names (``send(..., to=NAME)``), so a scheduler names receivers by keys
an operator installed, never by what a peer claims about itself.

File permissions are checked the way ssh checks its own. :func:`create_keys` makes the secret 0600
before it shows under its name (no other user can read it at any point). :meth:`Identity.load`
refuses a secret that group or others may access, or that another (non-root) user owns. An
allow-list directory must not be writable by group or others nor owned by another non-root user
(else anyone who may write there could add a key of their own); a ``.key`` file in it that group or
others may write is skipped, with a logged warning.

Roles. A key may carry a role in its certificate's ``metadata`` section (``--role``): ``prefill`` (a
sender: it serves KV blocks) or ``decode`` (a receiver: it asks for them). A key without a role
(``--role any``) may act as both; it is meant for single-process tests and tools. A sender's control
socket, which hands out the receiver-facing side, accepts only ``decode`` (or role-less) keys:
``allowed.name_of(key, role="decode")``; a receiver connects only to ``prefill`` (or role-less) keys:
``allowed.name_of(key, role="prefill")``. So one peers directory shared by every rank still keeps a
compromised decoder from posing as a sender to another decoder, and a compromised prefill rank from
saying hello to another prefill rank as a receiver.

A directory allow-list follows its folder at once and by contents: :meth:`AllowList.name_of` and
:meth:`AllowList.key_of` look at the folder on every call (one ``scandir`` and a ``stat`` per
``.key`` file; only changed files are read again), so a key file removed is no longer welcomed and a
key file made again under the same name is read again, whatever the folder's mtime says.
:meth:`AllowList.contains` answers from what was read last (no I/O, for per-frame checks), and
:meth:`AllowList.refresh` says which keys were withdrawn since it last ran, so that their
connections can be closed.
"""

from __future__ import annotations

import logging
import os
import shutil
import stat
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from .addresses import fingerprint, z85_decode

log = logging.getLogger("kvpolicy.transports")

ROLES = ("prefill", "decode")
"""The roles a key may carry: ``prefill`` (a sender), ``decode`` (a receiver). A key without a role
may act as either."""

_MAKE_KEYS = "make one with `kvpolicy keys new DIR --name NAME --role prefill|decode|any`"

_MAX_KEY_FILE = 64 * 1024
"""A certificate is a few hundred bytes; a larger file is not read."""

_RACY_NS = 100_000_000
"""A key file whose times are this recent (ns) is read again at the next look even when its
signature is unchanged: file times come from a coarse clock (a few ms), so two writes of the same
size within one tick, on the same inode, would leave the same signature."""


class KeyMaterialError(ValueError):
    """Key material that cannot be used; the message names the file and how to make a good one."""


def _check_z85_key(key: bytes | str, where: str) -> bytes:
    raw = key.encode() if isinstance(key, str) else bytes(key)
    if len(raw) != 40:
        raise KeyMaterialError(f"{where}: a CURVE key is 40 z85 characters, got {len(raw)}")
    try:
        z85_decode(raw)
    except Exception:
        raise KeyMaterialError(f"{where}: not z85 text") from None
    return raw


def _check_role(role: str | None) -> None:
    if role is not None and role not in ROLES:
        raise ValueError(f"role {role!r}: use 'prefill', 'decode' or None (any role)")


def _role_allows(key_role: str | None, wanted: str | None) -> bool:
    """A key without a role serves any role; one with a role only its own."""
    return wanted is None or key_role is None or key_role == wanted


# -- owners and modes (ssh's StrictModes) ---------------------------------------------------------


def _user(uid: int) -> str:
    try:
        import pwd

        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except (ImportError, KeyError):
        return f"uid {uid}"


def _foreign_owner(st: os.stat_result) -> bool:
    """Owned by a user other than this process's (effective) one and other than root."""
    euid = os.geteuid() if hasattr(os, "geteuid") else None
    return euid is not None and st.st_uid not in (euid, 0)


def _me() -> str:
    return _user(os.geteuid()) if hasattr(os, "geteuid") else "this user"


def _writers(mode: int) -> str:
    return " and ".join(who for who, bit in (("group", 0o020), ("others", 0o002)) if mode & bit)


def _untrusted(label: str, path: Path, st: os.stat_result, where: str, harm: str) -> str | None:
    """Why ``path`` (an allow-list folder or a public key file) cannot be trusted (None: it can):
    someone other than this user or root may write it, and so could ``harm``."""
    mode = stat.S_IMODE(st.st_mode)
    if mode & 0o022:
        return f"{label} is writable by {_writers(mode)} (mode {mode:04o}): whoever may write {where} could {harm}; run `chmod go-w {path}`"
    if _foreign_owner(st):
        return f"{label} is owned by {_user(st.st_uid)}, not by {_me()} or root: its owner could {harm}; run `chown {os.geteuid()} {path}` (or make it root's)"
    return None


def _unsafe_directory(path: Path, st: os.stat_result) -> str | None:
    """Why an allow-list directory cannot be trusted (None: it can)."""
    return _untrusted(f"allowed_peers directory {path}", path, st, "there", "add a key of their own")


def _unsafe_key_file(path: Path, st: os.stat_result) -> str | None:
    """Why a public key file cannot be trusted (None: it can)."""
    return _untrusted(str(path), path, st, "it", "put their own key in it")


def _unprotected_secret(path: Path, st: os.stat_result) -> str | None:
    """Why a secret key file must not be used (None: it may), as ssh says UNPROTECTED PRIVATE KEY FILE."""
    mode = stat.S_IMODE(st.st_mode)
    if mode & 0o077:
        return (
            f"{path}: UNPROTECTED PRIVATE KEY FILE: mode {mode:04o} gives group or others access to the secret key; "
            f"run `chmod 600 {path}` (and make a new key with `kvpolicy keys new ... --force` if another user may "
            "have read it)"
        )
    if _foreign_owner(st):
        return (
            f"{path}: the secret key is owned by {_user(st.st_uid)}, not by {_me()}: a secret of another user is not "
            f"this process's to use; run `chown {os.geteuid()} {path}`, or make a key of this user's own with "
            "`kvpolicy keys new`"
        )
    return None


# -- certificate files ----------------------------------------------------------------------------


@dataclass(frozen=True)
class _Certificate:
    public: bytes
    secret: bytes | None
    role: str | None
    stat: os.stat_result


def _parse_certificate(data: bytes) -> tuple[bytes | None, bytes | None, dict[str, str]]:
    """``(public key, secret key, metadata)`` of a certificate in ZeroMQ's ZPL format, as pyzmq's
    ``zmq.auth.create_certificates`` writes it: top-level section names (``metadata``, ``curve``) at
    the start of a line, their ``name = value`` entries indented below. Key lines are taken from any
    section but ``metadata`` (as ``zmq.auth.load_certificate`` takes them, and so metadata cannot
    carry a key)."""
    public = secret = None
    metadata: dict[str, str] = {}
    section = b""
    for raw in data.splitlines():
        line = raw.strip()
        if not line or line.startswith(b"#"):
            continue
        name, eq, value = line.partition(b"=")
        name, value = name.strip(), value.strip().strip(b" \t'\"")
        if section != b"metadata" and name in (b"public-key", b"secret-key") and eq:
            if name == b"public-key" and public is None:
                public = value
            elif name == b"secret-key" and secret is None:
                secret = value
        elif raw[:1] not in (b" ", b"\t"):
            section = name
        elif section == b"metadata" and eq:
            metadata[name.decode("utf-8", "replace")] = value.decode("utf-8", "replace")
    return public, secret, metadata


def _read_certificate(path: Path) -> _Certificate:
    """Read a certificate through one open file, so that the owner and mode checked (``fstat``) are
    those of the bytes read."""
    flags = os.O_RDONLY | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NONBLOCK", 0)
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        raise KeyMaterialError(f"{path}: cannot be read ({exc.strerror}); {_MAKE_KEYS}") from None
    with os.fdopen(fd, "rb") as file:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise KeyMaterialError(f"{path}: not a regular file; {_MAKE_KEYS}")
        data = file.read(_MAX_KEY_FILE + 1)
    if len(data) > _MAX_KEY_FILE:
        raise KeyMaterialError(f"{path}: over {_MAX_KEY_FILE} bytes, not a CURVE certificate; {_MAKE_KEYS}")
    public, secret, metadata = _parse_certificate(data)
    if public is None:
        raise KeyMaterialError(f"{path}: not a CURVE certificate (no public-key line); {_MAKE_KEYS}")
    role = metadata.get("role") or None
    if role == "any":
        role = None
    if role is not None and role not in ROLES:
        raise KeyMaterialError(
            f"{path}: role {role!r} is none of prefill, decode; make the key again with `kvpolicy keys new DIR --name NAME --role prefill|decode|any --force`"
        )
    return _Certificate(_check_z85_key(public, str(path)), None if secret is None else _check_z85_key(secret, str(path)), role, st)


def _stem(path: Path | str) -> str:
    return Path(path).name.removesuffix(".key_secret").removesuffix(".key")


@dataclass(frozen=True)
class Identity:
    """This side's CURVE key pair (z85 bytes), the name peers know it by and its role (``prefill``,
    ``decode``, or None: any)."""

    name: str
    public: bytes
    secret: bytes = field(repr=False)
    role: str | None = None

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
        """From an :class:`Identity`, a ``NAME.key_secret`` file, or a ``(public, secret)`` pair.

        A secret file that group or others may access (``mode & 0o077``), or that another user than
        this one (or root) owns, is refused with :class:`KeyMaterialError`, as ssh refuses an
        unprotected private key file."""
        if isinstance(spec, Identity):
            return spec
        if spec is None:
            return cls.generate()
        if isinstance(spec, (str, os.PathLike)):
            path = Path(spec)
            certificate = _read_certificate(path)
            if certificate.secret is None:
                raise KeyMaterialError(f"{path}: holds no secret key; pass the NAME.key_secret file made by `kvpolicy keys new`")
            problem = _unprotected_secret(path, certificate.stat)
            if problem:
                raise KeyMaterialError(problem)
            return cls(_stem(path), certificate.public, certificate.secret, certificate.role)
        if isinstance(spec, tuple) and len(spec) == 2:
            public = _check_z85_key(spec[0], "identity public key")
            return cls(fingerprint(public), public, _check_z85_key(spec[1], "identity secret key"))
        raise TypeError(f"identity must be a NAME.key_secret path, an Identity or a (public, secret) pair, got {spec!r}")


IdentitySpec = Identity | str | os.PathLike | tuple | None


class PeerKey(NamedTuple):
    """One allowed key: its name, the public key (z85 bytes) and its role (None: any role)."""

    name: str
    public: bytes
    role: str | None


@dataclass(frozen=True)
class _KeyFile:
    """What one ``.key`` file of an allow-list directory held when last read."""

    signature: tuple
    peer: PeerKey | None  # None: not usable (half-written, unsafe, bad role); skipped
    problem: str | None
    racy: bool


def _signature(st: os.stat_result) -> tuple:
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_mode, st.st_uid)


class AllowList:
    """The public keys this side talks to, each with a name and a role.

    Made from a directory of ``NAME.key`` files (looked at again by :meth:`name_of`, :meth:`key_of`
    and :meth:`refresh`: see the module docstring), a mapping ``{name: public_key}``, or an iterable
    of public keys, ``.key`` file paths and :class:`Identity` objects. Thread-safe.

    A directory must not be writable by group or others, nor owned by another non-root user: such a
    directory is refused at construction, and one that turns so later is no longer trusted (no key
    is allowed, an error is logged) until it is fixed. A ``.key`` file in it that group or others may
    write, or that does not parse, is skipped with a logged warning: the directory's permissions
    decide who may add keys, and one file that may have been tampered with must not take the other
    peers, which an operator installed, out with it. A ``.key`` file named on its own is refused
    (:class:`KeyMaterialError`), since the caller asked for exactly that key. If the directory itself
    vanishes (unmounted, removed), the keys read before stay allowed and a warning is logged: keys
    are withdrawn by removing their files.
    """

    def __init__(self, spec: Any) -> None:
        self._lock = threading.Lock()
        self._directory: Path | None = None
        self._peers: dict[bytes, PeerKey] = {}
        self._by_name: dict[str, bytes] = {}
        self._files: dict[str, _KeyFile] = {}
        self._trusted = True
        self._unreadable = False
        self._version = 0
        self._since: dict[bytes, set[str | None]] = {}
        self.roleless: Callable[[bytes], bool] = lambda public: True
        """Whether a key without a role may act in a role asked for (:meth:`name_of`,
        :meth:`contains`); a transceiver accepts one only from its own process, or with
        ``allow_roleless_peers`` (tests and tools)."""
        if spec is None:
            raise KeyMaterialError(
                "allowed_peers is required: the control plane talks only to peers whose public keys it knows. "
                "Make keys with `kvpolicy keys new DIR --name NAME --role prefill|decode` on each host, copy the "
                "NAME.key files into one directory, and pass allowed_peers=DIR"
            )
        peers: dict[bytes, PeerKey] = {}
        if isinstance(spec, (str, os.PathLike)) and Path(spec).is_dir():
            self._directory = Path(spec)
            problem = _unsafe_directory(self._directory, os.stat(self._directory))
            if problem:
                raise KeyMaterialError(problem)
            self._rescan()
        elif isinstance(spec, Mapping):
            for name, key in spec.items():
                key = _check_z85_key(key, f"allowed_peers[{name!r}]")
                peers[key] = PeerKey(str(name), key, None)
        elif isinstance(spec, (str, os.PathLike)) and Path(spec).is_file():
            peer = self._read_file(Path(spec))
            peers[peer.public] = peer
        elif isinstance(spec, Iterable) and not isinstance(spec, (str, bytes)):
            for item in spec:
                if isinstance(item, Identity):
                    peers[item.public] = PeerKey(item.name, item.public, item.role)
                elif isinstance(item, (str, os.PathLike)) and Path(item).is_file():
                    peer = self._read_file(Path(item))
                    peers[peer.public] = peer
                else:
                    key = _check_z85_key(item, "allowed_peers entry")
                    peers[key] = PeerKey(fingerprint(key), key, None)
        else:
            raise KeyMaterialError(f"allowed_peers {spec!r}: not a directory, a .key file, a mapping or a list of keys")
        if self._directory is None:
            self._install(peers)
        self._since = {key: {peer.role} for key, peer in self._peers.items()}

    @staticmethod
    def _read_file(path: Path) -> PeerKey:
        certificate = _read_certificate(path)
        problem = _unsafe_key_file(path, certificate.stat)
        if problem:
            raise KeyMaterialError(problem)
        return PeerKey(_stem(path), certificate.public, certificate.role)

    # -- the directory, by contents ---------------------------------------------------------------

    def _rescan(self) -> None:
        """Look at the directory (lock held): a ``stat`` of it, a ``scandir`` and a ``stat`` per
        ``.key`` entry; read again only the files whose signature changed (or that changed so recently
        that the signature cannot tell)."""
        folder = self._directory
        assert folder is not None
        try:
            problem = _unsafe_directory(folder, os.stat(folder))
            entries = [] if problem else self._entries(folder)
        except OSError as exc:
            if not self._unreadable:
                self._unreadable = True
                log.warning(
                    "allowed_peers directory %s cannot be read (%s): the %d keys read before stay allowed; remove key files to withdraw keys",
                    folder,
                    exc.strerror or exc,
                    len(self._peers),
                )
            return
        self._unreadable = False
        if problem:
            if self._trusted:
                self._trusted = False
                log.error("%s. Until then no peer is allowed", problem)
            self._files = {}
            self._install({})
            return
        if not self._trusted:
            self._trusted = True
            log.warning("allowed_peers directory %s is safe again: its keys are read again", folder)
        now = time.time_ns()
        files: dict[str, _KeyFile] = {}
        changed = False
        for name, path, signature in entries:
            known = self._files.get(name)
            if known is not None and known.signature == signature and not known.racy:
                files[name] = known
                continue
            files[name] = self._read_entry(Path(path), signature, now, known)
            changed = True
        if changed or files.keys() != self._files.keys():
            self._files = files
            self._install({f.peer.public: f.peer for _, f in sorted(files.items()) if f.peer is not None})

    @staticmethod
    def _entries(folder: Path) -> list[tuple[str, str, tuple]]:
        entries = []
        with os.scandir(folder) as listing:
            for entry in listing:
                if entry.name.startswith(".") or not entry.name.endswith(".key"):
                    continue
                try:
                    st = entry.stat()
                except OSError:
                    continue  # removed meanwhile, or a dangling link
                if stat.S_ISREG(st.st_mode):
                    entries.append((entry.name, entry.path, _signature(st)))
        return entries

    @staticmethod
    def _read_entry(path: Path, signature: tuple, now: int, known: _KeyFile | None) -> _KeyFile:
        # The signature kept is the one scandir saw, taken before the read: if the file changed in
        # between, the next look sees another signature and reads it again.
        racy = now - max(signature[3], signature[4]) < _RACY_NS
        try:
            certificate = _read_certificate(path)
            problem = _unsafe_key_file(path, certificate.stat)
        except KeyMaterialError as exc:
            certificate, problem = None, str(exc)
        if problem is not None:
            if known is None or known.problem != problem:
                log.warning("allowed_peers: skipping %s", problem)  # each problem names the file
            return _KeyFile(signature, None, problem, racy)
        assert certificate is not None
        return _KeyFile(signature, PeerKey(_stem(path), certificate.public, certificate.role), None, racy)

    def _install(self, peers: dict[bytes, PeerKey]) -> None:
        """Take ``peers`` as the allowed keys (lock held); a change bumps :attr:`version`."""
        if peers == self._peers:
            return
        self._peers = peers
        self._by_name = {peer.name: key for key, peer in peers.items()}
        self._version += 1
        for key, peer in peers.items():
            self._since.setdefault(key, set()).add(peer.role)

    def _look(self) -> None:
        if self._directory is not None:
            self._rescan()

    # -- queries ----------------------------------------------------------------------------------

    def name_of(self, public: bytes, role: str | None = None) -> str | None:
        """The name of an allowed key (z85 bytes), or None for a stranger.

        A directory is looked at on every call (it runs once per handshake): a key whose file was
        removed is a stranger at once. With ``role`` (``prefill`` or ``decode``), a key that carries
        another role is a stranger too; a key without a role matches any."""
        _check_role(role)
        with self._lock:
            self._look()
            peer = self._peers.get(public)
        return peer.name if peer is not None and self._allows(peer, role) else None

    def _allows(self, peer: PeerKey, role: str | None) -> bool:
        if peer.role is None and role is not None:
            return self.roleless(peer.public)
        return _role_allows(peer.role, role)

    def contains(self, public: bytes, role: str | None = None) -> bool:
        """Whether ``public`` was allowed (for ``role``, as :meth:`name_of`) when last looked at: no
        I/O, for per-frame checks; :meth:`refresh` (or any :meth:`name_of`) brings it up to date."""
        _check_role(role)
        peer = self._peers.get(public)
        return peer is not None and self._allows(peer, role)

    def role_of(self, public: bytes) -> str | None:
        """The role an allowed key carries (``prefill`` or ``decode``) as last read; None for a key
        without a role, or one not allowed (ask :meth:`contains` or :meth:`name_of` first)."""
        peer = self._peers.get(public)
        return None if peer is None else peer.role

    def key_of(self, name_or_key: str) -> bytes | None:
        """The public key named ``name_or_key`` (or that key itself, if allowed). A directory is
        looked at on every call: a key file made again under the same name is read at once."""
        with self._lock:
            self._look()
            raw = name_or_key.encode()
            if raw in self._peers:
                return raw
            return self._by_name.get(name_or_key)

    def refresh(self) -> frozenset[bytes]:
        """Look at the directory now; return the keys withdrawn since the last ``refresh``: removed,
        replaced in their file by another key, or allowed at any moment since with another role than
        they have now (their connections were made under rights they no longer have). Changes seen by
        :meth:`name_of` or :meth:`key_of` in between count too. A list or mapping never changes."""
        with self._lock:
            self._look()
            withdrawn = frozenset(key for key, roles in self._since.items() if key not in self._peers or roles != {self._peers[key].role})
            self._since = {key: {peer.role} for key, peer in self._peers.items()}
            return withdrawn

    @property
    def watches_directory(self) -> bool:
        """Made from a folder, which an operator may change (a list or mapping never changes)."""
        return self._directory is not None

    @property
    def version(self) -> int:
        """A number bumped at every change of the allowed keys, their names or roles."""
        return self._version

    def entries(self) -> tuple[PeerKey, ...]:
        """The allowed keys as last read (no I/O; :meth:`refresh` first for the newest), by name."""
        with self._lock:
            return tuple(sorted(self._peers.values()))

    def __len__(self) -> int:
        return len(self._peers)


def _fsync(path: str | os.PathLike, directory: bool = False) -> None:
    fd = os.open(path, os.O_RDONLY | (getattr(os, "O_DIRECTORY", 0) if directory else 0))
    try:
        os.fsync(fd)
    except OSError:
        pass  # some file systems cannot fsync a directory; the rename is what matters
    finally:
        os.close(fd)


def _put(made: str, final: Path, overwrite: bool) -> None:
    """Move ``made`` to ``final`` atomically; without ``overwrite``, fail if ``final`` exists (a hard
    link never replaces a file, so there is no check-then-write race)."""
    if overwrite:
        os.replace(made, final)
        return
    try:
        os.link(made, final)
    except FileExistsError:
        raise
    except OSError:  # a file system without hard links
        if os.path.lexists(final):
            raise FileExistsError(17, "File exists", str(final)) from None
        os.replace(made, final)


def create_keys(directory: str | os.PathLike, name: str, role: str | None = None, *, overwrite: bool = True) -> tuple[Path, Path]:
    """Write ``NAME.key`` (public, mode 0644) and ``NAME.key_secret`` (secret, mode 0600) into
    ``directory`` (made 0700 if missing); return their paths.

    role: ``prefill`` (a sender), ``decode`` (a receiver), or None (or ``"any"``: no role, both; for
    single-process tests and tools). It is written into the ``metadata`` section of both files.
    overwrite: replace a pair of that name (False: refuse with :class:`KeyMaterialError`).

    No other user can read the secret at any moment: the pair is written (in ZeroMQ's certificate
    format, by pyzmq) into a fresh 0700 directory inside ``directory``, made 0600 / 0644 there, and
    only then renamed to its name, the secret first. So the public key, the file that peers trust,
    never shows before its secret is in place, and a crash leaves at most a secret without its
    public file (run again to replace it).
    """
    import zmq.auth

    if not name or "/" in name or "\0" in name or name.startswith(".") or len(name) > 64:
        raise KeyMaterialError(f"key name {name!r}: use 1-64 characters, no '/' and no leading '.'")
    if role == "any":
        role = None
    if role is not None and role not in ROLES:
        raise KeyMaterialError(f"key role {role!r}: use 'prefill' (a sender), 'decode' (a receiver) or None (any)")
    folder = Path(directory)
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    public_path, secret_path = folder / f"{name}.key", folder / f"{name}.key_secret"
    if not overwrite:
        for path in (secret_path, public_path):
            if os.path.lexists(path):
                raise KeyMaterialError(f"{path}: a key named {name!r} exists already; pass --force (overwrite=True in Python) to replace it")
    metadata = {"role": role} if role else None
    scratch = tempfile.mkdtemp(prefix=".kvpolicy-new-key-", dir=folder)  # mode 0700: only this user enters
    try:
        made_public, made_secret = zmq.auth.create_certificates(scratch, name, metadata=metadata)
        os.chmod(made_secret, 0o600)
        if metadata:
            _add_metadata(Path(made_public), metadata)
        os.chmod(made_public, 0o644)
        _check_made(Path(made_public), Path(made_secret), role)
        _fsync(made_secret)
        _fsync(made_public)
        try:
            _put(made_secret, secret_path, overwrite)
        except FileExistsError:
            raise KeyMaterialError(f"{secret_path}: a key named {name!r} exists already; pass --force (overwrite=True in Python) to replace it") from None
        try:
            _put(made_public, public_path, overwrite)
        except FileExistsError:
            os.unlink(secret_path)  # ours, linked a moment ago: leave the folder as it was
            raise KeyMaterialError(f"{public_path}: a key named {name!r} exists already; pass --force (overwrite=True in Python) to replace it") from None
        _fsync(folder, directory=True)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return public_path, secret_path


def _add_metadata(public: Path, metadata: dict[str, str]) -> None:
    """pyzmq writes metadata into the secret file only; the public file, which peers read, needs the
    role too: add the same ``    name = value`` lines under its (empty) ``metadata`` section."""
    text = public.read_text(encoding="utf-8")
    if "\nmetadata\n" not in text:
        raise KeyMaterialError(f"{public}: pyzmq wrote no metadata section; cannot record the key's role")
    lines = "".join(f"    {key} = {value}\n" for key, value in metadata.items())
    public.write_text(text.replace("\nmetadata\n", "\nmetadata\n" + lines, 1), encoding="utf-8")


def _check_made(public: Path, secret: Path, role: str | None) -> None:
    """The files just written read back as one pair with its role (else nothing is moved into place)."""
    mine, theirs = _read_certificate(secret), _read_certificate(public)
    if not (mine.public == theirs.public and mine.secret and theirs.secret is None and mine.role == theirs.role == role):
        raise KeyMaterialError(f"{public}: the key pair pyzmq wrote does not read back as written; nothing was replaced")
