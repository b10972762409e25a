"""A strict reader (and canonical writer) of two UCX binary formats a NIXL peer sends.

NIXL's UCX backend puts two UCX blobs into an agent's metadata: its UCP worker address (the
connection info) and, per registered region, a packed remote key. UCX unpacks both trusting every
length, count and flag in them, so a peer's blob is read here first, by code that bounds and checks
each field, and refuses what it cannot read strictly. Only the standard library is used; neither NIXL
nor UCX is imported.

The formats are those of UCX **1.23.0** (the ``libucp`` bundled with the ``nixl`` 1.5.1 wheel), as
written by ``src/ucp/wireup/address.c`` (``ucp_address_pack``; flags in ``address.h``),
``src/ucp/core/ucp_rkey.c`` (``ucp_rkey_pack`` / ``ucp_memh_pack``), ``src/ucs/type/serialize.h``
(little-endian fields packed back to back) and ``src/ucs/algorithm/crc.c`` (the transport-name
checksum), checked against real blobs from this build. All integers are little-endian.

Worker address (``ucp_worker_get_address``), version 1 (UCX's default) and version 2
(``UCX_ADDRESS_VERSION=v2``), non-unified mode::

    header       v1: 1 byte, low nibble 0 (version), high nibble flags
                 v2: 1 byte, low nibble 1, high nibble the release (UCX minor % 16: 7), then 1 byte flags
                 flags: DEBUG_INFO 0x1, WORKER_UUID 0x2 (CLIENT_ID 0x4, AM_ONLY 0x8: refused)
    uuid         u64
    name         (only with DEBUG_INFO: UCX_ADDRESS_DEBUG_INFO=y) u8 length + "host:pid"
    per device:
      md byte      md index (v1: 5 bits, v2: 7 bits), 0x80 EMPTY (v1 also 0x40 ALLOC, 0x20 REG)
      length byte  device-address length (5 bits; v2: 31 means "next byte"), 0x80 LAST,
                   0x40 NUM_PATHS (a u8 follows), 0x20 SYS_DEVICE (a u8 follows)
      [num_paths u8] [sys_dev u8] device address
      per transport on the device:
        u16 checksum of the transport name (CRC-16/CCITT of e.g. b"tcp")
        attributes   v1: f32 overhead, f32 bandwidth, f32 latency overhead,
                         u32 priority (8 bits) | flags << 8 (14 capability bits, atomics at 30, 31)
                     v2: u8 fp8 overhead, bandwidth, latency, u8 priority, u16 segment size / 64,
                         u16 flags (10 bits)
        length byte  interface-address length (6 bits; v2: 63 means "next byte"), 0x80 LAST
                     (last transport of the device), 0x40 HAS_EP_ADDR
        interface address
        [per endpoint address: u8 length, address, u8 lane (6 bits) | 0x80 LAST]
    v1 only: a last pseudo device 0x80 | release (0x87 for 1.23), 0x80 (LAST, empty): the release
    version; in v2 the last real device carries LAST.

Remote key (``ucp_rkey_pack``)::

    u64 md_map, u8 memory type, per set bit (ascending): u8 size + that memory domain's UCT rkey,
    then the memory's system device: u8 (0xff unknown), and for a known device, per device in the
    distance map: u8 sys_dev, u8 fp8 latency, u8 fp8 bandwidth.
    A registration no memory domain holds gives UCX's dummy key: md_map 0 and the memory type only.

Where the source read differs from 1.23's output: the stored ``ucp_rkey.c`` packs the system-device
byte only for a known device, while 1.23 packs it always (0xff for DRAM); this reader requires it in
every key but the dummy one. The stored ``address.c`` (with the v1 release-version device and the v2
header) matches the addresses seen byte for byte.

Refused, each with the byte offset: every truncation and trailing byte; a version other than v1/v2;
a v2 release nibble or v1 release device other than 1.23's (7); header flags other than WORKER_UUID
(required) and DEBUG_INFO (CLIENT_ID and AM_ONLY appear only in client-server wireup, never in a
worker address); an address without devices; a zero uuid; a non-printable worker name; the ALLOC /
REG memory-domain flags (1.23 packs none); EMPTY on a real device; LAST anywhere but where 1.23 puts
it; md indices at or above UCX's 64 memory domains, extended (two-byte) md indices, and devices out of
md order; non-canonical extended lengths; NUM_PATHS below 2 and SYS_DEVICE 0xff (1.23 packs neither);
more than ``max_devices`` devices or ``max_transports`` (and UCX's 128) transports; a transport-name
checksum that is not a UCX 1.23 transport's, one repeated on a device, or transports of two UCX
components on one memory domain (or a single-domain component on two); for the sample
configuration's transports (self, tcp, sysv, posix, cma), device and interface addresses of another
length than their fixed structures (a tcp interface address without its port killed a peer); v1
attributes that are not
finite, non-negative normal floats (bandwidth non-zero) or set undefined flag bits; v2 attributes
with undefined flag bits; endpoint addresses (wireup messages only) unless asked for, and then more
than 64 per transport or a lane byte with the unused 0x40 bit. In a remote key: a memory type other
than the one expected (host by default; CUDA on request); a md bit without its part, or one the
caller's worker address does not have; a missing system-device byte; a system device for host
memory; a partial distance entry, distances out of order or for a device >= 64.

Deliberately not checked: the contents of per-process values (uuid, worker name, device, interface
and endpoint addresses, UCT rkey bytes), which only the peer's UCX/UCT can judge; the values of the
transport attributes (performance figures, priority, which defined flags are set) and of the md
indices beyond their order, which can differ between configurations: :meth:`WorkerAddress.shape`
and :meth:`RemoteKey.shape` carry them, for comparison with this process's own blobs. Not read:
unified mode (``UCX_UNIFIED_MODE=y``: no lengths on the wire, and nothing marks it; read as
non-unified such an address is meant to fail, as the real one does at its first transport's
attributes, but is not recognised as such) and addresses packed with resource indices (wireup
messages), which the format does not mark either. The v1 ALLOC / REG md flags are refused because
1.23 packs neither for the sample configuration's memory domains; whether it does for others (an
InfiniBand HCA's) was not seen. CUDA remote keys with a known system device are read per the source but
were not seen here (no GPU): they are refused unless the caller asks for CUDA memory.
"""

from __future__ import annotations

import struct
from collections.abc import Collection
from dataclasses import dataclass
from typing import Literal

__all__ = [
    "FLAG_DEBUG_INFO",
    "FLAG_WORKER_UUID",
    "MAX_LANES",
    "MAX_MDS",
    "MAX_RESOURCES",
    "MEMORY_TYPE_CUDA",
    "MEMORY_TYPE_HOST",
    "MEMORY_TYPES",
    "RELEASE",
    "TRANSPORTS",
    "UCX_VERSION",
    "Device",
    "Distance",
    "EpAddress",
    "IfaceAttrsV1",
    "IfaceAttrsV2",
    "RemoteKey",
    "SysDevice",
    "Transport",
    "UcxWireError",
    "WorkerAddress",
    "crc16",
    "read_remote_key",
    "read_worker_address",
    "write_remote_key",
    "write_worker_address",
]

UCX_VERSION = "1.23.0"
RELEASE = 23 % 16
"""The release nibble UCX 1.23 packs (its minor version modulo 16)."""

MAX_MDS = 64
"""UCX's limit on memory domains (``UCP_MAX_MDS``): md indices are below it."""
MAX_RESOURCES = 128
"""UCX's limit on transport resources (``UCP_MAX_RESOURCES``): the most entries an address unpacks to."""
MAX_LANES = 64
"""UCX's limit on endpoint lanes (``UCP_MAX_LANES``): the most endpoint addresses per transport."""

MEMORY_TYPE_HOST = 0
MEMORY_TYPE_CUDA = 1
MEMORY_TYPES = {MEMORY_TYPE_HOST: "host", MEMORY_TYPE_CUDA: "cuda"}
"""``ucs_memory_type_t`` values read here (DRAM and VRAM pools); UCX defines more, all refused."""

SYS_DEVICE_UNKNOWN = 0xFF

FLAG_DEBUG_INFO = 0x1
FLAG_WORKER_UUID = 0x2
FLAG_CLIENT_ID = 0x4
FLAG_AM_ONLY = 0x8

_LAST = 0x80
_HAS_EP_ADDR = 0x40
_NUM_PATHS = 0x40
_SYS_DEVICE = 0x20
_DEVICE_LEN_MASK = 0x1F
_IFACE_LEN_MASK = 0x3F
_MD_EMPTY = 0x80
_MD_ALLOC = 0x40
_MD_REG = 0x20
_MD_MASK = {1: 0x1F, 2: 0x7F}
_LANE_MASK = 0x3F

_V1_FLAGS = (1 << 14) - 1 | 1 << 22 | 1 << 23
"""Defined bits of a v1 ``prio_cap_flags >> 8``: 13 capability bits, the event bit, two atomic bits."""
_V2_FLAGS = (1 << 10) - 1
"""Defined bits of a v2 attribute ``flags`` (``UCP_ADDR_IFACE_FLAG_*``)."""

_V1_ATTRS = struct.Struct("<fffI")
_V2_ATTRS = struct.Struct("<BBBBHH")
_U16 = struct.Struct("<H")
_U64 = struct.Struct("<Q")


def crc16(data: bytes) -> int:
    """UCX's ``ucs_crc16`` (CRC-16/CCITT, reflected polynomial 0x8408, initial 0xffff, inverted)."""
    crc = 0xFFFF
    for byte in data:
        crc ^= byte
        for _ in range(8):
            crc = (crc >> 1) ^ (0x8408 if crc & 1 else 0)
    return ~crc & 0xFFFF


_COMPONENTS = {
    "self": "self",
    "tcp": "tcp",
    "sysv": "sysv",
    "posix": "posix",
    "cma": "cma",
    "knem": "knem",
    "xpmem": "xpmem",
    "cuda_copy": "cuda_cpy",
    "cuda_ipc": "cuda_ipc",
    "gdr_copy": "gdr_copy",
    "rc_verbs": "ib",
    "ud_verbs": "ib",
    "rc_mlx5": "ib",
    "ud_mlx5": "ib",
    "dc_mlx5": "ib",
    "rc_gda": "ib",
    "rc_gdp": "ib",
    "srd": "ib",
    "gga_mlx5": "gga",
}
"""UCX 1.23 transports (those of the bundled build, found in its libraries, and the other 1.23 ones
above) with the component whose memory domains carry them."""
_MULTI_MD = frozenset({"ib", "gga"})
"""Components with a memory domain per device (an HCA each); the others have one memory domain."""

_LENGTHS: dict[str, tuple[int, int | None, int]] = {
    "self": (0, 0, 8),
    "tcp": (6, None, 2),
    "sysv": (8, 8, 8),
    "posix": (8, 8, 8),
    "cma": (8, 8, 4),
}
"""(least, most device-address length; interface-address length) of the sample configuration's
transports: fixed structures their UCT code reads whole (a tcp device address is two bytes and an IPv4
or IPv6 address, more on loopback; its interface address a port). Other transports' lengths are not
checked."""

TRANSPORTS = {crc16(name.encode()): name for name in _COMPONENTS}
"""Transport-name checksum -> name, for every transport this reader accepts."""
assert len(TRANSPORTS) == len(_COMPONENTS), "transport-name checksums collide"


class UcxWireError(ValueError):
    """A blob this module refuses: ``offset`` is the byte of the blob at fault, ``reason`` says why."""

    def __init__(self, offset: int, reason: str) -> None:
        super().__init__(f"byte {offset}: {reason}")
        self.offset = offset
        self.reason = reason


# -- the model ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class IfaceAttrsV1:
    """A v1 transport's attributes (``ucp_address_packed_iface_attr_t``); ``flags`` is
    ``prio_cap_flags >> 8``."""

    overhead: float
    bandwidth: float
    latency: float
    priority: int
    flags: int


@dataclass(frozen=True)
class IfaceAttrsV2:
    """A v2 transport's attributes (``ucp_address_v2_packed_iface_attr_t``): fp8 figures kept as their
    bytes, ``seg_size`` in units of 64 bytes."""

    overhead: int
    bandwidth: int
    latency: int
    priority: int
    seg_size: int
    flags: int


@dataclass(frozen=True)
class EpAddress:
    """One endpoint address of a transport (wireup messages only) and the lane it is for."""

    address: bytes
    lane: int


@dataclass(frozen=True)
class Transport:
    """One transport on a device: its name checksum, attributes, interface address and endpoint
    addresses."""

    name_csum: int
    info: IfaceAttrsV1 | IfaceAttrsV2
    address: bytes
    ep_addresses: tuple[EpAddress, ...] = ()

    @property
    def name(self) -> str:
        """The transport's name (``"tcp"``...), known for every transport this module reads."""
        return TRANSPORTS.get(self.name_csum, f"<{self.name_csum:#06x}>")

    def shape(self, *, attributes: bool = True) -> tuple[object, ...]:
        """Everything but the address contents (see :meth:`WorkerAddress.shape`)."""
        return (self.name_csum, self.info if attributes else None, len(self.address), tuple((len(e.address), e.lane) for e in self.ep_addresses))


@dataclass(frozen=True)
class Device:
    """One device: its memory domain, device address, transports, paths and system device."""

    md_index: int
    address: bytes
    transports: tuple[Transport, ...]
    num_paths: int = 1
    sys_dev: int | None = None

    def shape(self, *, attributes: bool = True) -> tuple[object, ...]:
        """Everything but the address contents and the system device's number (see
        :meth:`WorkerAddress.shape`)."""
        transports = tuple(t.shape(attributes=attributes) for t in self.transports)
        return (self.md_index, len(self.address), self.num_paths, self.sys_dev is not None, transports)


@dataclass(frozen=True)
class WorkerAddress:
    """A packed UCP worker address. ``version`` is 1 or 2 (UCX's wire values 0 and 1); ``flags`` the
    header flags; ``name`` the worker name (with DEBUG_INFO only); ``release`` the UCX release
    nibble."""

    version: int
    flags: int
    uuid: int
    devices: tuple[Device, ...]
    name: str | None = None
    release: int = RELEASE

    @property
    def md_indices(self) -> frozenset[int]:
        """The memory domains the address's devices are on."""
        return frozenset(d.md_index for d in self.devices)

    def shape(self, *, attributes: bool = True) -> tuple[object, ...]:
        """Everything except per-process values (uuid, worker name, the contents of the device,
        interface and endpoint addresses, the system-device numbers): equal for two processes of
        one configuration. ``attributes=False`` leaves out the transports' attributes too (their
        performance figures depend on where the process runs)."""
        devices = tuple(d.shape(attributes=attributes) for d in self.devices)
        return (self.version, self.flags, self.release, devices)

    def form(self) -> tuple[object, ...]:
        """What two processes of one deployment (one UCX build, the same transports) agree on: the
        :meth:`shape` with each transport's priority and capability flags (and v2 segment size), but
        not its measured figures (overhead, bandwidth, latency), which depend on where it runs. A
        peer's address of another form would make UCX pick lanes the peer's side cannot serve (one
        such address aborted its target in ``stubs.c``): compare before loading it."""

        def transport(t: Transport) -> tuple[object, ...]:
            info = t.info
            kept = (info.priority, info.seg_size, info.flags) if isinstance(info, IfaceAttrsV2) else (info.priority, info.flags)
            return (t.name_csum, kept, len(t.address), tuple((len(e.address), e.lane) for e in t.ep_addresses))

        devices = tuple((d.md_index, len(d.address), d.num_paths, d.sys_dev is not None, tuple(map(transport, d.transports))) for d in self.devices)
        return (self.version, self.flags & ~FLAG_DEBUG_INFO, self.release, devices)

    def describe(self) -> str:
        """The transports per memory domain, for messages: ``md0 self, md1 tcp, ...``."""
        return ", ".join(f"md{d.md_index} {'+'.join(t.name for t in d.transports) or '-'}" for d in self.devices)


@dataclass(frozen=True)
class Distance:
    """A remote key's distance from the memory to a system device (fp8 figures kept as bytes)."""

    sys_dev: int
    latency: int
    bandwidth: int


@dataclass(frozen=True)
class SysDevice:
    """A remote key's trailer: the memory's system device (``None``: unknown) and its distances."""

    device: int | None
    distances: tuple[Distance, ...] = ()

    @property
    def kind(self) -> Literal["unknown", "device"]:
        return "unknown" if self.device is None else "device"


@dataclass(frozen=True)
class RemoteKey:
    """A packed remote key: md_map, memory type, (md index, UCT rkey) per memory domain, and the
    system-device trailer (``None`` only in UCX's dummy key, md_map 0)."""

    md_map: int
    mem_type: int
    parts: tuple[tuple[int, bytes], ...]
    sys_dev: SysDevice | None

    @property
    def md_indices(self) -> frozenset[int]:
        """The memory domains the key has a part for."""
        return frozenset(md for md, _ in self.parts)

    def shape(self) -> tuple[object, ...]:
        """md_map, memory type, each part's size and the trailer's kind (``"absent"``, ``"unknown"``
        or ``"device"``): everything but the UCT rkey contents and distances."""
        kind = "absent" if self.sys_dev is None else self.sys_dev.kind
        return (self.md_map, self.mem_type, tuple(len(rkey) for _, rkey in self.parts), kind)


# -- reading --------------------------------------------------------------------------------------


class _Cursor:
    def __init__(self, data: bytes) -> None:
        self.data = data
        self.pos = 0

    def take(self, n: int, what: str) -> bytes:
        left = len(self.data) - self.pos
        if n > left:
            raise UcxWireError(self.pos, f"{what}: needs {n} byte(s), {left} left")
        out = self.data[self.pos : self.pos + n]
        self.pos += n
        return out

    def u8(self, what: str) -> int:
        return self.take(1, what)[0]

    def u16(self, what: str) -> int:
        value: int = _U16.unpack(self.take(2, what))[0]
        return value

    def u64(self, what: str) -> int:
        value: int = _U64.unpack(self.take(8, what))[0]
        return value

    def end(self, what: str) -> None:
        if self.pos != len(self.data):
            raise UcxWireError(self.pos, f"{len(self.data) - self.pos} byte(s) after the {what}")


def _float_ok(bits: int, *, nonzero: bool) -> bool:
    """A non-negative, finite, normal (or zero) IEEE single."""
    sign, exponent, mantissa = bits >> 31, (bits >> 23) & 0xFF, bits & 0x7FFFFF
    if sign or exponent == 0xFF:
        return False
    if exponent == 0:
        return mantissa == 0 and not nonzero
    return True


def _read_attrs(cur: _Cursor, version: int, name: str) -> IfaceAttrsV1 | IfaceAttrsV2:
    at = cur.pos
    if version == 1:
        raw = cur.take(_V1_ATTRS.size, f"{name}'s attributes")
        words = struct.unpack("<IIII", raw)
        for i, (field, nonzero) in enumerate((("overhead", False), ("bandwidth", True), ("latency overhead", False))):
            if not _float_ok(words[i], nonzero=nonzero):
                value = struct.unpack("<f", raw[4 * i : 4 * i + 4])[0]
                need = "a positive" if nonzero else "a non-negative"
                raise UcxWireError(at + 4 * i, f"{name}'s {field} {value!r} (bits {words[i]:#010x}) is not {need} finite normal float")
        overhead, bandwidth, latency, prio_cap = _V1_ATTRS.unpack(raw)
        flags = prio_cap >> 8
        if flags & ~_V1_FLAGS:
            raise UcxWireError(at + 12, f"{name}'s attribute flags {prio_cap:#010x} set bits UCX 1.23 does not define ({(flags & ~_V1_FLAGS) << 8:#010x})")
        return IfaceAttrsV1(overhead, bandwidth, latency, prio_cap & 0xFF, flags)
    raw = cur.take(_V2_ATTRS.size, f"{name}'s attributes")
    overhead8, bandwidth8, latency8, priority, seg_size, flags2 = _V2_ATTRS.unpack(raw)
    if flags2 & ~_V2_FLAGS:
        raise UcxWireError(at + 6, f"{name}'s attribute flags {flags2:#06x} set bits UCX 1.23 does not define ({flags2 & ~_V2_FLAGS:#06x})")
    return IfaceAttrsV2(overhead8, bandwidth8, latency8, priority, seg_size, flags2)


def _read_length(cur: _Cursor, version: int, mask: int, what: str) -> tuple[int, int]:
    """A length byte (flags in its top bits) and, in v2, its extension: (flags, length)."""
    at = cur.pos
    byte = cur.u8(what)
    length = byte & mask
    if version == 2 and length == mask:
        length = cur.u8(f"{what} (extended)")
        if length < mask:
            raise UcxWireError(at + 1, f"{what} {length} packed in an extension byte (UCX extends only lengths >= {mask})")
    return byte & ~mask & 0xFF, length


def read_worker_address(data: bytes, *, max_devices: int = 64, max_transports: int = 256, ep_addresses: bool = False) -> WorkerAddress:
    """Read a packed UCP worker address (UCX 1.23, v1 or v2, non-unified), or raise
    :class:`UcxWireError` with the offset of the first byte at fault. ``ep_addresses=True`` also
    reads endpoint addresses (which only wireup messages carry)."""
    data = bytes(data)
    cur = _Cursor(data)
    head = cur.u8("header")
    wire_version = head & 0x0F
    if wire_version == 0:
        version, flags, release = 1, head >> 4, RELEASE
    elif wire_version == 1:
        version, release = 2, head >> 4
        if release != RELEASE:
            raise UcxWireError(0, f"v2 address of release nibble {release}: this reader follows UCX {UCX_VERSION} (nibble {RELEASE})")
        flags = cur.u8("header flags")
    else:
        raise UcxWireError(0, f"address version {wire_version} (header {head:#04x}): UCX 1.23 defines 0 (v1) and 1 (v2)")
    flags_at = 0 if version == 1 else 1
    if flags & ~(FLAG_DEBUG_INFO | FLAG_WORKER_UUID | FLAG_CLIENT_ID | FLAG_AM_ONLY):
        raise UcxWireError(flags_at, f"header flags {flags:#04x} set bits UCX 1.23 does not define")
    if flags & (FLAG_CLIENT_ID | FLAG_AM_ONLY):
        raise UcxWireError(flags_at, f"header flags {flags:#04x}: CLIENT_ID / AM_ONLY appear only in client-server wireup, never in a worker address")
    if not flags & FLAG_WORKER_UUID:
        raise UcxWireError(flags_at, f"header flags {flags:#04x} lack WORKER_UUID: a worker address always carries its uuid")
    uuid_at = cur.pos
    uuid = cur.u64("worker uuid")
    if uuid == 0:
        raise UcxWireError(uuid_at, "worker uuid 0 (UCX's 'no uuid' value)")
    name = None
    if flags & FLAG_DEBUG_INFO:
        length = cur.u8("worker name length")
        name_at = cur.pos
        raw = cur.take(length, "worker name")
        bad = next((i for i, b in enumerate(raw) if not 0x20 <= b < 0x7F), None)
        if bad is not None:
            raise UcxWireError(name_at + bad, f"worker name byte {raw[bad]:#04x} is not printable ASCII")
        name = raw.decode("ascii")
    if cur.pos < len(data) and data[cur.pos] == 0xFF:
        raise UcxWireError(cur.pos, "an address without devices (UCP_NULL_RESOURCE): nothing to connect to")

    limit = min(max_transports, MAX_RESOURCES)
    devices: list[Device] = []
    count = 0
    md_component: dict[int, str] = {}
    component_md: dict[str, int] = {}
    while True:
        md_at = cur.pos
        md_byte = cur.u8("device md index")
        if version == 1 and md_byte & _MD_EMPTY:
            # The release-version pseudo device that ends a v1 address.
            if not devices:
                raise UcxWireError(md_at, f"empty device {md_byte:#04x} before any real device")
            if md_byte != _MD_EMPTY | RELEASE:
                raise UcxWireError(md_at, f"release-version device {md_byte:#04x}: UCX {UCX_VERSION} packs {_MD_EMPTY | RELEASE:#04x}")
            end = cur.u8("release-version device length")
            if end != _LAST:
                raise UcxWireError(md_at + 1, f"release-version device length byte {end:#04x}: UCX packs {_LAST:#04x} (last, empty)")
            break
        if md_byte & _MD_EMPTY:
            raise UcxWireError(md_at, f"md byte {md_byte:#04x} marks a device without transports: UCX 1.23 packs none in a v2 address")
        if version == 1 and md_byte & (_MD_ALLOC | _MD_REG):
            raise UcxWireError(md_at, f"md byte {md_byte:#04x} sets ALLOC/REG: UCX 1.23 packs neither in a worker address")
        md_index = md_byte & _MD_MASK[version]
        if version == 2 and md_index == _MD_MASK[2]:
            raise UcxWireError(md_at, f"md byte {md_byte:#04x} announces an extended md index (>= 127): UCX has at most {MAX_MDS} memory domains")
        if md_index >= MAX_MDS:
            raise UcxWireError(md_at, f"md index {md_index}: UCX has at most {MAX_MDS} memory domains")
        if devices and md_index < devices[-1].md_index:
            raise UcxWireError(md_at, f"md index {md_index} after {devices[-1].md_index}: UCX packs devices in memory-domain order")
        if len(devices) >= max_devices:
            raise UcxWireError(md_at, f"more than {max_devices} devices")
        len_at = cur.pos
        dev_flags, dev_len = _read_length(cur, version, _DEVICE_LEN_MASK, "device address length")
        last_device = bool(dev_flags & _LAST)
        if version == 1 and last_device:
            raise UcxWireError(len_at, "LAST on a real device: a UCX 1.23 v1 address ends with the release-version device")
        num_paths = 1
        if dev_flags & _NUM_PATHS:
            paths_at = cur.pos
            num_paths = cur.u8("device path count")
            if num_paths < 2:
                raise UcxWireError(paths_at, f"device path count {num_paths}: UCX packs it only when above 1")
        sys_dev = None
        if dev_flags & _SYS_DEVICE:
            sys_at = cur.pos
            sys_dev = cur.u8("device system device")
            if sys_dev == SYS_DEVICE_UNKNOWN:
                raise UcxWireError(sys_at, "system device 0xff (unknown): UCX packs it only when known")
        dev_address = cur.take(dev_len, "device address")

        transports: list[Transport] = []
        seen: set[int] = set()
        while True:
            csum_at = cur.pos
            if count >= limit:
                raise UcxWireError(csum_at, f"more than {limit} transports")
            csum = cur.u16("transport name checksum")
            name_of = TRANSPORTS.get(csum)
            if name_of is None:
                raise UcxWireError(csum_at, f"transport name checksum {csum:#06x} is no UCX {UCX_VERSION} transport's")
            if csum in seen:
                raise UcxWireError(csum_at, f"transport {name_of} twice on one device")
            seen.add(csum)
            component = _COMPONENTS[name_of]
            if md_component.setdefault(md_index, component) != component:
                raise UcxWireError(csum_at, f"transport {name_of} ({component}) on memory domain {md_index}, which carries {md_component[md_index]}")
            if component not in _MULTI_MD and component_md.setdefault(component, md_index) != md_index:
                raise UcxWireError(csum_at, f"transport {name_of} on memory domain {md_index}: its component {component} is on {component_md[component]}")
            lengths = _LENGTHS.get(name_of)
            if lengths is not None:
                least, most, _ = lengths
                if dev_len < least or (most is not None and dev_len > most):
                    want = f"at least {least}" if most is None else f"{least}"
                    raise UcxWireError(len_at, f"{name_of} on a device address of {dev_len} bytes: UCX packs {want}")
            info = _read_attrs(cur, version, name_of)
            iface_at = cur.pos
            iface_flags, iface_len = _read_length(cur, version, _IFACE_LEN_MASK, f"{name_of}'s interface address length")
            if lengths is not None and iface_len != lengths[2]:
                raise UcxWireError(iface_at, f"{name_of}'s interface address of {iface_len} bytes: UCX packs {lengths[2]}")
            iface_address = cur.take(iface_len, f"{name_of}'s interface address")
            eps: list[EpAddress] = []
            if iface_flags & _HAS_EP_ADDR:
                if not ep_addresses:
                    raise UcxWireError(iface_at, f"{name_of} carries endpoint addresses: only wireup messages do, never a worker address")
                while True:
                    if len(eps) >= MAX_LANES:
                        raise UcxWireError(cur.pos, f"more than {MAX_LANES} endpoint addresses")
                    ep_len = cur.u8("endpoint address length")
                    ep_address = cur.take(ep_len, "endpoint address")
                    lane_at = cur.pos
                    lane_byte = cur.u8("endpoint lane")
                    if lane_byte & ~(_LANE_MASK | _LAST):
                        raise UcxWireError(lane_at, f"endpoint lane byte {lane_byte:#04x} sets the unused bit 0x40")
                    eps.append(EpAddress(ep_address, lane_byte & _LANE_MASK))
                    if lane_byte & _LAST:
                        break
            transports.append(Transport(csum, info, iface_address, tuple(eps)))
            count += 1
            if iface_flags & _LAST:
                break
        devices.append(Device(md_index, dev_address, tuple(transports), num_paths, sys_dev))
        if last_device:
            break
    cur.end("address")
    return WorkerAddress(version, flags, uuid, tuple(devices), name, release)


def read_remote_key(data: bytes, *, mem_type: int = MEMORY_TYPE_HOST, md_indices: Collection[int] | None = None) -> RemoteKey:
    """Read a packed remote key (UCX 1.23) of memory of type ``mem_type`` (host unless asked), or
    raise :class:`UcxWireError` with the offset of the first byte at fault. ``md_indices``, when
    given (the peer's worker address's :attr:`~WorkerAddress.md_indices`), bounds its memory domains."""
    if mem_type not in MEMORY_TYPES:
        raise ValueError(f"memory type {mem_type}: this reader reads {sorted(MEMORY_TYPES)}")
    data = bytes(data)
    cur = _Cursor(data)
    md_map = cur.u64("md_map")
    type_at = cur.pos
    found = cur.u8("memory type")
    if found != mem_type:
        known = MEMORY_TYPES.get(found)
        what = f"memory type {found} ({known})" if known else f"memory type {found}, which this reader does not read"
        raise UcxWireError(type_at, f"{what}; expected {mem_type} ({MEMORY_TYPES[mem_type]})")
    if md_map == 0:
        # UCX's dummy key: a registration no memory domain holds.
        cur.end("dummy key (md_map 0)")
        return RemoteKey(0, found, (), None)
    parts: list[tuple[int, bytes]] = []
    for md in range(MAX_MDS):
        if not md_map >> md & 1:
            continue
        if md_indices is not None and md not in md_indices:
            raise UcxWireError(md // 8, f"md_map {md_map:#x} names memory domain {md}, which the worker address does not have")
        size = cur.u8(f"memory domain {md}'s rkey size")
        parts.append((md, cur.take(size, f"memory domain {md}'s rkey")))
    sys_at = cur.pos
    sys_dev = cur.u8("system device (UCX 1.23 packs it after the memory domains)")
    if sys_dev == SYS_DEVICE_UNKNOWN:
        cur.end("unknown system device")
        return RemoteKey(md_map, found, tuple(parts), SysDevice(None))
    if found == MEMORY_TYPE_HOST:
        raise UcxWireError(sys_at, f"system device {sys_dev} for host memory: UCX 1.23 packs 0xff (unknown)")
    if sys_dev >= MAX_MDS:
        raise UcxWireError(sys_at, f"system device {sys_dev}: UCX's distance map holds devices below 64")
    left = len(data) - cur.pos
    if left % 3:
        raise UcxWireError(cur.pos + left - left % 3, f"{left} byte(s) of distances: not whole 3-byte entries")
    distances: list[Distance] = []
    while cur.pos < len(data):
        at = cur.pos
        dev, latency, bandwidth = cur.take(3, "distance")
        if dev >= 64:
            raise UcxWireError(at, f"distance to system device {dev}: UCX's distance map holds devices below 64")
        if distances and dev <= distances[-1].sys_dev:
            raise UcxWireError(at, f"distance to system device {dev} after {distances[-1].sys_dev}: UCX packs them in ascending order")
        distances.append(Distance(dev, latency, bandwidth))
    return RemoteKey(md_map, found, tuple(parts), SysDevice(sys_dev, tuple(distances)))


# -- writing --------------------------------------------------------------------------------------


def _length(out: bytearray, version: int, mask: int, flags: int, length: int, what: str) -> None:
    if version == 2 and length >= mask:
        if length > 0xFF:
            raise ValueError(f"{what} {length} does not fit a byte")
        out += bytes((flags | mask, length))
        return
    if length > mask:
        raise ValueError(f"{what} {length} does not fit in {mask.bit_length()} bits (v1)")
    out.append(flags | length)


def write_worker_address(address: WorkerAddress) -> bytes:
    """UCX 1.23's packing of ``address``: ``read_worker_address(write_worker_address(a)) == a`` and
    ``write_worker_address(read_worker_address(b)) == b`` for every address read. Raises
    :class:`ValueError` for a value the format cannot hold."""
    try:
        return _write_address(address)
    except struct.error as exc:
        raise ValueError(f"a value out of its field's range: {exc}") from None


def _write_address(address: WorkerAddress) -> bytes:
    version = address.version
    if version not in (1, 2):
        raise ValueError(f"address version {version}: 1 or 2")
    if not 0 <= address.flags <= 0x0F or not 0 <= address.release <= 0x0F:
        raise ValueError(f"header flags {address.flags} / release {address.release}: 4 bits each")
    if address.flags & ~(FLAG_DEBUG_INFO | FLAG_WORKER_UUID) or not address.flags & FLAG_WORKER_UUID:
        raise ValueError(f"header flags {address.flags:#x}: WORKER_UUID, and DEBUG_INFO or not")
    if (address.name is not None) != bool(address.flags & FLAG_DEBUG_INFO):
        raise ValueError("a worker name goes with the DEBUG_INFO flag, and only with it")
    out = bytearray((address.flags << 4,) if version == 1 else (1 | address.release << 4, address.flags))
    out += _U64.pack(address.uuid)
    if address.name is not None:
        name = address.name.encode("ascii")
        if len(name) > 0xFF:
            raise ValueError("worker name longer than 255 bytes")
        out += bytes((len(name),)) + name
    if not address.devices:
        raise ValueError("an address without devices")
    for number, device in enumerate(address.devices):
        if not 0 <= device.md_index < min(MAX_MDS, _MD_MASK[version] + 1):
            raise ValueError(f"md index {device.md_index} out of range for a v{version} address")
        if not device.transports:
            raise ValueError("a device without transports")
        if not 1 <= device.num_paths <= 0xFF or device.sys_dev == SYS_DEVICE_UNKNOWN:
            raise ValueError(f"path count {device.num_paths} / system device {device.sys_dev}: 1-255 / None or 0-254")
        out.append(device.md_index)
        last = _LAST if version == 2 and number == len(address.devices) - 1 else 0
        flags = last | (_NUM_PATHS if device.num_paths != 1 else 0) | (_SYS_DEVICE if device.sys_dev is not None else 0)
        _length(out, version, _DEVICE_LEN_MASK, flags, len(device.address), "device address length")
        if device.num_paths != 1:
            out.append(device.num_paths)
        if device.sys_dev is not None:
            out.append(device.sys_dev)
        out += device.address
        for index, transport in enumerate(device.transports):
            out += _U16.pack(transport.name_csum)
            info = transport.info
            if isinstance(info, IfaceAttrsV1) != (version == 1):
                raise ValueError(f"{type(info).__name__} in a v{version} address")
            if isinstance(info, IfaceAttrsV1):
                out += _V1_ATTRS.pack(info.overhead, info.bandwidth, info.latency, info.priority | info.flags << 8)
            else:
                out += _V2_ATTRS.pack(info.overhead, info.bandwidth, info.latency, info.priority, info.seg_size, info.flags)
            flags = (_LAST if index == len(device.transports) - 1 else 0) | (_HAS_EP_ADDR if transport.ep_addresses else 0)
            _length(out, version, _IFACE_LEN_MASK, flags, len(transport.address), "interface address length")
            out += transport.address
            for number_ep, ep in enumerate(transport.ep_addresses):
                if len(ep.address) > 0xFF or not 0 <= ep.lane <= _LANE_MASK:
                    raise ValueError(f"endpoint address of {len(ep.address)} bytes / lane {ep.lane} out of range")
                out.append(len(ep.address))
                out += ep.address
                out.append(ep.lane | (_LAST if number_ep == len(transport.ep_addresses) - 1 else 0))
    if version == 1:
        out += bytes((_MD_EMPTY | address.release, _LAST))
    return bytes(out)


def write_remote_key(key: RemoteKey) -> bytes:
    """UCX 1.23's packing of ``key``: ``read_remote_key(write_remote_key(k)) == k`` and
    ``write_remote_key(read_remote_key(b)) == b`` for every key read. Raises :class:`ValueError` for
    an inconsistent key."""
    try:
        return _write_key(key)
    except struct.error as exc:
        raise ValueError(f"a value out of its field's range: {exc}") from None


def _write_key(key: RemoteKey) -> bytes:
    mds = [md for md, _ in key.parts]
    if mds != sorted(set(mds)) or any(not 0 <= md < MAX_MDS for md in mds) or key.md_map != sum(1 << md for md in mds):
        raise ValueError(f"md_map {key.md_map:#x} does not match the parts' md indices {mds} (ascending, below {MAX_MDS})")
    if (key.sys_dev is None) != (key.md_map == 0):
        raise ValueError("the system-device trailer is absent exactly in the dummy key (md_map 0)")
    out = bytearray(_U64.pack(key.md_map))
    if key.mem_type not in MEMORY_TYPES:
        raise ValueError(f"memory type {key.mem_type}: this module writes {sorted(MEMORY_TYPES)}")
    out.append(key.mem_type)
    for _, rkey in key.parts:
        if len(rkey) > 0xFF:
            raise ValueError(f"a UCT rkey of {len(rkey)} bytes")
        out.append(len(rkey))
        out += rkey
    if key.sys_dev is not None:
        out.append(SYS_DEVICE_UNKNOWN if key.sys_dev.device is None else key.sys_dev.device)
        for distance in key.sys_dev.distances:
            out += bytes((distance.sys_dev, distance.latency, distance.bandwidth))
    return bytes(out)
