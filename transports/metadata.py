"""Read a peer's NIXL agent metadata strictly before any NIXL call sees it.

NIXL's own reader (``loadRemoteMD``, with UCX unpacking the worker address and the remote keys)
trusts every length and value it reads: one changed byte of real metadata kills the loading process
(issue 40: 22 of 2,396 one-byte mutations and truncations crashed a child that loaded them). A peer
on the allow-list is trusted with its key, not with its bytes, so every blob a peer sends (in a hello,
in a welcome, or published to etcd) is read here first, by a reader that bounds and checks every
field, and NIXL is handed what this module writes back from what it read (:func:`admit`).

The format read is NIXL 1.5's (``nixlSerDes``); :data:`FORMATS` pins it to the NIXL releases whose
output it was checked against, and :func:`format_supported` refuses any other release with a clear
error before a transceiver starts. The serialisation is a header ``nixlSerDes|`` followed by fields
``tag | u64 length | value | '|'``, in this order::

    Agent        the agent name
    Conns        u64: how many backends follow, then per backend:
      t          the backend's name (UCX)
      c          its connection info (for UCX: the packed worker address)
    (no tag)     "MemSection"
    nixlSecElms  u64: how many (backend, memory type) sections follow, then per section:
      bknd       the backend's name
      nixlDList  "nixlSDList"
      t          u32: the memory type (0 DRAM, 1 VRAM)
      n          u64: how many regions follow, then per region:
      (no tag)   u64 address, u64 length, u64 device id, then the backend's public data (for UCX:
                 the packed remote key)

Beyond the form, a blob must be what this deployment expects (:class:`Expected`): the agent name the
hello announced, exactly the backends this side configured, and one region, the pool the peer
announced (its base address, its size from its layout and block count, its memory type and device).
The backend's own parts are read by its reader (:mod:`.ucx_wire` for UCX): a backend without one is
refused. Every refusal names the byte offset and what was wrong.
"""

from __future__ import annotations

import functools
import struct
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

__all__ = [
    "FORMATS",
    "MEMORY_TYPES",
    "AgentMetadata",
    "Expected",
    "MetadataError",
    "Region",
    "Section",
    "admit",
    "format_supported",
    "read_metadata",
    "write_metadata",
]

FORMATS = ("1.5",)
"""NIXL releases (major.minor) whose metadata format this module reads; checked against 1.5.1."""

MEMORY_TYPES = {"DRAM": 0, "VRAM": 1}
"""NIXL's ``nixl_mem_t`` values of the memory a KV pool may live in (BLK, OBJ and FILE are refused)."""

HEADER = b"nixlSerDes|"
MAX_NAME = 256
MAX_BACKEND_NAME = 32
MAX_CONN_INFO = 64 << 10
MAX_PUBLIC_DATA = 4 << 10
MAX_BACKENDS = 8
MAX_SECTIONS = 8
MAX_REGIONS = 64
MAX_BLOB = 1 << 20
_U64 = struct.Struct("<Q")
_U32 = struct.Struct("<I")
_REGION = struct.Struct("<QQQ")


class MetadataError(ValueError):
    """Metadata this side will not hand to NIXL; ``offset`` is the byte where reading stopped."""

    def __init__(self, offset: int, message: str) -> None:
        super().__init__(f"at byte {offset}: {message}")
        self.offset = offset
        self.reason = message


@dataclass(frozen=True)
class Region:
    """One registered memory region: where it is in its owner's address space, and the backend's
    public data for it (UCX: the packed remote key)."""

    address: int
    length: int
    device_id: int
    public: bytes


@dataclass(frozen=True)
class Section:
    """The regions one backend registered for one memory type."""

    backend: str
    memory_type: int
    regions: tuple[Region, ...]


@dataclass(frozen=True)
class AgentMetadata:
    """What NIXL metadata says: the agent, each backend's connection info, the registered memory."""

    agent: str
    connections: tuple[tuple[str, bytes], ...]
    sections: tuple[Section, ...]


@dataclass(frozen=True)
class Expected:
    """What a peer's metadata must say in this deployment: the agent its hello named, the backends
    this side configured, and its pool as its hello announced it."""

    agent: str
    backends: tuple[str, ...]
    memory_type: str
    address: int
    length: int
    device_id: int
    ucx_address: bytes = b""
    """This process's own UCX worker address: a peer's must have its form (the same transports, memory
    domains, priorities and capability flags: :meth:`.ucx_wire.WorkerAddress.form`). Empty: not
    compared (tests of the format alone)."""


class _Reader:
    def __init__(self, blob: bytes) -> None:
        self.blob = blob
        self.at = 0

    def fail(self, message: str, at: int | None = None) -> MetadataError:
        return MetadataError(self.at if at is None else at, message)

    def field(self, tag: bytes, limit: int, what: str) -> bytes:
        """One ``tag | u64 length | value | '|'`` field; the value."""
        blob, at = self.blob, self.at
        if blob[at : at + len(tag)] != tag:
            raise self.fail(f"expected the {what} field (tag {tag.decode()!r})")
        at += len(tag)
        if at + 8 > len(blob):
            raise self.fail(f"the {what} field's length is cut off", at)
        (length,) = _U64.unpack_from(blob, at)
        if length > limit:
            raise self.fail(f"the {what} field says {length} bytes (at most {limit})", at)
        at += 8
        end = at + length
        if end + 1 > len(blob):
            raise self.fail(f"the {what} field says {length} bytes; {max(0, len(blob) - at)} follow", at - 8)
        if blob[end : end + 1] != b"|":
            raise self.fail(f"the {what} field does not end with '|'", end)
        self.at = end + 1
        return blob[at:end]

    def count(self, tag: bytes, limit: int, what: str) -> int:
        start = self.at
        value = self.field(tag, 8, what)
        if len(value) != 8:
            raise self.fail(f"the {what} count is {len(value)} bytes, not 8", start)
        (number,) = _U64.unpack(value)
        if number > limit:
            raise self.fail(f"{number} {what} (at most {limit})", start)
        return number

    def name(self, tag: bytes, limit: int, what: str) -> str:
        start = self.at
        value = self.field(tag, limit, what)
        try:
            text = value.decode("ascii")
        except UnicodeDecodeError:
            raise self.fail(f"the {what} is not ASCII", start) from None
        if not text or not text.isprintable():
            raise self.fail(f"the {what} {text!r} is empty or not printable", start)
        return text


def read_metadata(blob: bytes) -> AgentMetadata:
    """Read NIXL 1.5 agent metadata; :class:`MetadataError` (with the byte offset) on anything that
    is not exactly that format: a wrong tag, a length past the end or over its bound, a count over
    its bound, a name that is not printable ASCII, a duplicate backend, bytes left over."""
    return _read(bytes(blob))[0]


def _read(blob: bytes) -> tuple[AgentMetadata, dict[str, int], dict[str, list[int]]]:
    """The metadata, where each backend's connection info starts, and where each region's public
    data starts (per backend, in order)."""
    if len(blob) > MAX_BLOB:
        raise MetadataError(0, f"{len(blob)} bytes (at most {MAX_BLOB})")
    reader = _Reader(blob)
    if not blob.startswith(HEADER):
        raise MetadataError(0, "it does not start with NIXL's header 'nixlSerDes|'")
    reader.at = len(HEADER)
    agent = reader.name(b"Agent", MAX_NAME, "agent name")
    connections: list[tuple[str, bytes]] = []
    info_at: dict[str, int] = {}
    public_at: dict[str, list[int]] = {}
    for _ in range(reader.count(b"Conns", MAX_BACKENDS, "backends")):
        start = reader.at
        backend = reader.name(b"t", MAX_BACKEND_NAME, "backend name")
        if any(backend == seen for seen, _ in connections):
            raise reader.fail(f"backend {backend!r} appears twice", start)
        info_at[backend] = reader.at + 1 + 8
        connections.append((backend, reader.field(b"c", MAX_CONN_INFO, f"{backend} connection info")))
    start = reader.at
    if reader.field(b"", 16, "memory section marker") != b"MemSection":
        raise reader.fail("expected the memory section marker 'MemSection'", start)
    sections: list[Section] = []
    for _ in range(reader.count(b"nixlSecElms", MAX_SECTIONS, "memory sections")):
        start = reader.at
        backend = reader.name(b"bknd", MAX_BACKEND_NAME, "section's backend")
        marker = reader.at
        if reader.field(b"nixlDList", 16, "descriptor list marker") != b"nixlSDList":
            raise reader.fail("expected the descriptor list marker 'nixlSDList'", marker)
        at = reader.at
        kind = reader.field(b"t", 4, "memory type")
        if len(kind) != 4:
            raise reader.fail(f"the memory type is {len(kind)} bytes, not 4", at)
        (memory_type,) = _U32.unpack(kind)
        if memory_type not in MEMORY_TYPES.values():
            raise reader.fail(f"memory type {memory_type} is not DRAM (0) or VRAM (1)", at)
        if any(s.backend == backend and s.memory_type == memory_type for s in sections):
            raise reader.fail(f"a second {backend} section for memory type {memory_type}", start)
        regions: list[Region] = []
        for _ in range(reader.count(b"n", MAX_REGIONS, "regions")):
            at = reader.at
            value = reader.field(b"", _REGION.size + MAX_PUBLIC_DATA, "region")
            if len(value) < _REGION.size:
                raise reader.fail(f"a region of {len(value)} bytes (at least {_REGION.size})", at)
            address, length, device_id = _REGION.unpack_from(value)
            if length == 0 or address + length > 1 << 64:
                raise reader.fail(f"region {address:#x}+{length} is empty or wraps around", at)
            if regions and address < regions[-1].address + regions[-1].length:
                raise reader.fail("regions overlap or are not in address order", at)
            regions.append(Region(address, length, device_id, value[_REGION.size :]))
            public_at.setdefault(backend, []).append(at + 8 + _REGION.size)
        sections.append(Section(backend, memory_type, tuple(regions)))
    if reader.at != len(blob):
        raise reader.fail(f"{len(blob) - reader.at} bytes after the last section")
    return AgentMetadata(agent, tuple(connections), tuple(sections)), info_at, public_at


def _field(tag: bytes, value: bytes) -> bytes:
    return tag + _U64.pack(len(value)) + value + b"|"


def write_metadata(metadata: AgentMetadata) -> bytes:
    """NIXL 1.5's serialisation of ``metadata``: ``write_metadata(read_metadata(b)) == b`` for every
    blob :func:`read_metadata` accepts."""
    out = [HEADER, _field(b"Agent", metadata.agent.encode()), _field(b"Conns", _U64.pack(len(metadata.connections)))]
    for backend, info in metadata.connections:
        out += [_field(b"t", backend.encode()), _field(b"c", info)]
    out += [_field(b"", b"MemSection"), _field(b"nixlSecElms", _U64.pack(len(metadata.sections)))]
    for section in metadata.sections:
        out += [_field(b"bknd", section.backend.encode()), _field(b"nixlDList", b"nixlSDList")]
        out += [_field(b"t", _U32.pack(section.memory_type)), _field(b"n", _U64.pack(len(section.regions)))]
        out += [_field(b"", _REGION.pack(r.address, r.length, r.device_id) + r.public) for r in section.regions]
    return b"".join(out)


BackendCheck = Callable[[AgentMetadata, "Expected", int, list[int]], None]
"""A backend's reader: (the metadata, what is expected, where its connection info starts, where each
of its regions' public data starts) -> None, or :class:`MetadataError` with the offset in the blob."""


def _ucx_check(metadata: AgentMetadata, expected: Expected, info_at: int, offsets: list[int]) -> None:
    """UCX's parts: the worker address (of this process's own form) and each region's remote key,
    read by :mod:`.ucx_wire`."""
    from . import ucx_wire

    try:
        address = ucx_wire.read_worker_address(dict(metadata.connections)["UCX"])
    except ucx_wire.UcxWireError as exc:
        raise MetadataError(info_at + exc.offset, f"UCX worker address: {exc.reason}") from None
    if expected.ucx_address:
        own = _own_address(expected.ucx_address)
        if address.form() != own.form():
            raise MetadataError(
                info_at,
                f"its UCX worker address has another form than this process's ({address.describe()} against {own.describe()}, "
                "or other priorities or capability flags): every rank must run the same UCX build with the same transports",
            )
    regions = [(section, region) for section in metadata.sections if section.backend == "UCX" for region in section.regions]
    for (section, region), at in zip(regions, offsets, strict=True):
        # A remote key of the section's memory (UCX: 0 host, 1 CUDA) naming only memory domains the
        # worker address has (a domain it lacks crashed UCX's unpacking: docs/nixl-crashes.md).
        try:
            memory = ucx_wire.MEMORY_TYPE_CUDA if section.memory_type == MEMORY_TYPES["VRAM"] else ucx_wire.MEMORY_TYPE_HOST
            ucx_wire.read_remote_key(region.public, mem_type=memory, md_indices=address.md_indices)
        except ucx_wire.UcxWireError as exc:
            raise MetadataError(at + exc.offset, f"UCX remote key: {exc.reason}") from None


@functools.lru_cache(maxsize=8)
def _own_address(data: bytes) -> Any:
    from . import ucx_wire

    return ucx_wire.read_worker_address(data)


BACKENDS: dict[str, BackendCheck] = {"UCX": _ucx_check}
"""Readers of each backend's own parts; a backend without one is refused."""


def admit(blob: bytes, expected: Expected) -> bytes:
    """The bytes to hand NIXL for a peer's metadata, or :class:`MetadataError` saying why not.

    Reads ``blob`` strictly (:func:`read_metadata`), checks it says what ``expected`` says (the agent,
    exactly the configured backends, each with a reader here, and one section per backend holding
    one region: the announced pool), reads each backend's own parts, and returns the canonical
    re-serialisation of what was read (equal to ``blob`` for every blob accepted)."""
    blob = bytes(blob)
    metadata, info_at, offsets = _read(blob)
    if metadata.agent != expected.agent:
        raise MetadataError(len(HEADER), f"it names agent {metadata.agent!r}, not {expected.agent!r} as its hello did")
    backends = [backend for backend, _ in metadata.connections]
    if sorted(backends) != sorted(expected.backends):
        raise MetadataError(len(HEADER), f"it offers backends {backends}, not this deployment's {list(expected.backends)}")
    memory_type = MEMORY_TYPES.get(expected.memory_type)
    if memory_type is None:
        raise MetadataError(0, f"the hello announced memory type {expected.memory_type!r} (DRAM or VRAM)")
    for backend in backends:
        sections = [s for s in metadata.sections if s.backend == backend]
        if len(sections) != 1 or sections[0].memory_type != memory_type or len(sections[0].regions) != 1:
            found = [(s.memory_type, len(s.regions)) for s in sections]
            raise MetadataError(
                blob.find(b"MemSection|"),
                f"{backend} registers (memory type, regions) {found}; expected one {expected.memory_type} region, the pool",
            )
        region = sections[0].regions[0]
        if (region.address, region.length, region.device_id) != (expected.address, expected.length, expected.device_id):
            raise MetadataError(
                offsets[backend][0] - _REGION.size,
                f"{backend}'s region is {region.address:#x}+{region.length} on device {region.device_id}; the hello announced "
                f"the pool at {expected.address:#x}+{expected.length} on device {expected.device_id}",
            )
    for backend, _info in metadata.connections:
        reader = BACKENDS.get(backend)
        if reader is None:
            raise MetadataError(len(HEADER), f"kvpolicy has no reader of backend {backend!r}'s metadata (it reads {sorted(BACKENDS)})")
        reader(metadata, expected, info_at[backend], offsets.get(backend, []))
    canonical = write_metadata(metadata)
    if canonical != blob:  # (cannot happen for a blob read strictly; kept as the last word)
        raise MetadataError(0, "it does not re-serialise to the same bytes")
    return canonical


def format_supported(version: str, formats: Iterable[str] = FORMATS) -> str | None:
    """None when NIXL ``version`` (e.g. ``"1.5.1"``) writes a metadata format this module reads;
    else why not, with what to do."""
    release = ".".join(version.split(".")[:2])
    if release in formats:
        return None
    return (
        f"NIXL {version} is installed; kvpolicy reads the metadata format of NIXL {', '.join(formats)} only "
        f"(a peer's metadata is read strictly before NIXL sees it). Install nixl=={FORMATS[-1]}.* or a kvpolicy that reads {release}"
    )
