"""The strict reader of UCX's packed worker address and remote key (transports/ucx_wire.py).

The samples are real: NIXL 1.5.1 with its bundled UCX 1.23.0 on this project's development machine,
``UCX_MODULES=^ib UCX_NET_DEVICES=lo`` unless a sample says otherwise, one 1 MiB DRAM region.
"""

from __future__ import annotations

import os
import random
import struct

import pytest

from kvpolicy.transports.ucx_wire import (
    MEMORY_TYPE_CUDA,
    RELEASE,
    Device,
    Distance,
    EpAddress,
    IfaceAttrsV1,
    RemoteKey,
    SysDevice,
    Transport,
    UcxWireError,
    WorkerAddress,
    crc16,
    read_remote_key,
    read_worker_address,
    write_remote_key,
    write_worker_address,
)

from tests.support.nixl_blobs import REAL_ADDRESSES

SAMPLE_ADDRESS = bytes.fromhex(
    "20 bd b0 97 0f 29 aa da 21 00 00 63 75 77 cc 2b 32 00 40 97 50 00 00 00 00 00 4f 03 c0 88 f1 70 65 c3 5e 85 81 4b 01 0e 01 02 49 24 19"
    " a8 99 df 92 fe f9 ff ff ef cf 19 17 b7 51 38 53 9e 3e 4b d7 e0 37 37 01 13 23 00 82 8c cd 02 08 49 24 19 a8 99 df 92 7e 8d 53 77 cc 2b 32"
    " 00 00 70 50 77 cc ab 33 00 4f 23 c0 88 35 80 1a 01 00 00 00 00 03 08 49 24 19 a8 99 df 92 7e a7 d3 77 cc 2b 32 00 00 70 50 77 cc ab 33 00"
    " 4f 23 c0 88 91 55 00 80 03 00 00 c0 04 08 49 24 19 a8 99 df 92 7e 47 8b bd 37 06 36 00 24 2e 50 77 cc ab 33 00 92 21 00 84 91 55 00 00 87 80"
)
SAMPLE_KEY = bytes.fromhex("01 00 00 00 00 00 00 00 00 00 ff")

UNIFIED_ADDRESS = bytes.fromhex(
    # UCX_UNIFIED_MODE=y: lengths are left out of the wire (the peer takes them from its own
    # interfaces) and nothing marks the mode, so this reader cannot read it, and must refuse it.
    "206027cda71ac6b41500006375800000008038a542b903e111f2010e0102492419a899df92fef9ffffefcf1981d7e03737bf7f0408492419a899df927e478b8477ccab334c7800008780"
)
DUMMY_KEY = bytes.fromhex("00 00 00 00 00 00 00 00 00")  # UCX_TLS=tcp: no memory domain registers the region

MUTATIONS = (lambda b: b ^ 0xFF, lambda b: 0x00, lambda b: 0x80, lambda b: b ^ 0x01, lambda b: 0x7F)


def refused(read, blob: bytes) -> UcxWireError:
    with pytest.raises(UcxWireError) as caught:
        read(blob)
    error = caught.value
    assert 0 <= error.offset <= len(blob) and f"byte {error.offset}" in str(error) and error.reason
    return error


def mutants(blob: bytes):
    """(offset, new value, mutated blob) for each single-byte mutation of ``blob`` that changes it."""
    for offset, byte in enumerate(blob):
        for value in sorted({mutate(byte) for mutate in MUTATIONS} - {byte}):
            yield offset, value, blob[:offset] + bytes((value,)) + blob[offset + 1 :]


def roles(address: WorkerAddress) -> list[str]:
    """What each byte of the packed ``address`` is, written out from the format independently of the
    reader: 'content' (per-process: uuid, device/interface/endpoint address bytes), 'name' (the worker
    name, per-process but printable ASCII), 'attribute' (a transport's attributes), 'index' (a device's
    md byte) or 'structure' (the rest: header, lengths, flags, checksums, the release-version device)."""
    out = ["structure"] * (1 if address.version == 1 else 2) + ["content"] * 8
    if address.name is not None:
        out += ["structure"] + ["name"] * len(address.name)
    for device in address.devices:
        out += ["index", "structure"]
        out += ["structure"] * (device.num_paths != 1) + ["content"] * (device.sys_dev is not None) + ["content"] * len(device.address)
        for transport in device.transports:
            out += ["structure"] * 2 + ["attribute"] * (16 if address.version == 1 else 8) + ["structure"] + ["content"] * len(transport.address)
            for ep in transport.ep_addresses:
                out += ["structure"] + ["content"] * len(ep.address) + ["structure"]
    return out + ["structure"] * (2 if address.version == 1 else 0)


# -- the samples ----------------------------------------------------------------------------------


def test_the_sample_address_reads_as_the_format_says():
    address = read_worker_address(SAMPLE_ADDRESS)
    assert (address.version, address.flags, address.release, address.name) == (1, 0x2, RELEASE, None)
    assert address.uuid == int.from_bytes(SAMPLE_ADDRESS[1:9], "little") == 0x21DAAA290F97B0BD
    assert address.md_indices == frozenset(range(5))
    assert [d.md_index for d in address.devices] == [0, 1, 2, 3, 4]
    assert [[t.name for t in d.transports] for d in address.devices] == [["self"], ["tcp"], ["sysv"], ["posix"], ["cma"]]
    assert [len(d.address) for d in address.devices] == [0, 14, 8, 8, 8]
    assert [len(t.address) for d in address.devices for t in d.transports] == [8, 2, 8, 8, 4]
    assert address.devices[1].transports[0].address == bytes.fromhex("8ccd")  # byte 72 (0x82) is its length and LAST
    tcp = address.devices[1].transports[0].info
    assert isinstance(tcp, IfaceAttrsV1) and tcp.priority == 1 and tcp.bandwidth > 0
    assert crc16(b"tcp") == 0x19CF and roles(address).count("content") == 8 + 38 + 30
    assert write_worker_address(address) == SAMPLE_ADDRESS and len(roles(address)) == len(SAMPLE_ADDRESS)


def test_the_sample_key_reads_as_the_format_says():
    key = read_remote_key(SAMPLE_KEY)
    assert key == RemoteKey(md_map=1, mem_type=0, parts=((0, b""),), sys_dev=SysDevice(None))
    assert key.md_indices == frozenset({0}) and key.shape() == (1, 0, (0,), "unknown")
    assert write_remote_key(key) == SAMPLE_KEY
    assert read_remote_key(SAMPLE_KEY, md_indices=read_worker_address(SAMPLE_ADDRESS).md_indices) == key


@pytest.mark.parametrize("env", sorted(REAL_ADDRESSES))
def test_real_addresses_read_and_round_trip(env):
    blob = REAL_ADDRESSES[env]
    address = read_worker_address(blob)
    assert write_worker_address(address) == blob and read_worker_address(write_worker_address(address)) == address
    assert address.version == (2 if "v2" in env else 1) and (address.name is not None) == ("DEBUG_INFO" in env)
    assert len(roles(address)) == len(blob)


def test_the_dummy_key_reads_and_round_trips():
    key = read_remote_key(DUMMY_KEY)
    assert key == RemoteKey(0, 0, (), None) and key.shape() == (0, 0, (), "absent") and write_remote_key(key) == DUMMY_KEY


def test_a_unified_mode_address_is_refused():
    error = refused(read_worker_address, UNIFIED_ADDRESS)
    assert error.offset == 13 and "overhead" in error.reason


def test_a_second_process_differs_only_in_per_process_values():
    # Two processes of one configuration (the second with UCX_ADDRESS_DEBUG_INFO=y): the same devices
    # and transports, other uuids and tcp ports.
    sample, other = read_worker_address(SAMPLE_ADDRESS), read_worker_address(REAL_ADDRESSES["UCX_ADDRESS_DEBUG_INFO=y"])
    assert sample.uuid != other.uuid and sample.devices[1].transports[0].address != other.devices[1].transports[0].address
    assert other.shape()[1:] != sample.shape()[1:]  # DEBUG_INFO is in the header flags
    assert other.shape()[3] == sample.shape()[3]


# -- real agents ----------------------------------------------------------------------------------


def _nixl_fields(blob: bytes):
    """NIXL 1.5's serialisation, for this test: ``nixlSerDes|`` then ``tag | u64 length | value | '|'``;
    the tags are known in order, a region's is empty."""
    assert blob.startswith(b"nixlSerDes|")
    at, fields = len(b"nixlSerDes|"), []
    tags = [b"Agent", b"Conns", b"t", b"c", b"", b"nixlSecElms", b"bknd", b"nixlDList", b"t", b"n"]
    while at < len(blob):
        tag = tags.pop(0) if tags else b""
        assert blob[at : at + len(tag)] == tag
        at += len(tag)
        (length,) = struct.unpack_from("<Q", blob, at)
        value = blob[at + 8 : at + 8 + length]
        assert blob[at + 8 + length : at + 9 + length] == b"|"
        fields.append((tag, value))
        at += 9 + length
    return fields


@pytest.fixture(scope="module")
def agents_metadata():
    pytest.importorskip("nixl._api", reason="real UCX blobs need NIXL (pip install kvpolicy[transfer])")
    np = pytest.importorskip("numpy", reason="registering memory needs numpy (kvpolicy[transfer])")
    from kvpolicy.transports.agent import NixlSettings, create_agent

    buffers = [np.zeros(1 << 20, dtype=np.uint8) for _ in range(3)]
    agents, blobs = [], []
    for name, regions in (("decode-0", buffers[:1]), ("prefill-0", buffers)):
        agent = create_agent(name, NixlSettings())
        agent.register_memory([(b.ctypes.data, b.nbytes, 0, "") for b in regions], "DRAM")
        agents.append(agent)
        blobs.append(agent.get_agent_metadata())
    yield blobs, (agents, buffers)  # both kept alive while the tests run


def test_fresh_agents_blobs_read_and_round_trip(agents_metadata):
    blobs, _ = agents_metadata
    addresses, keys = [], []
    for blob in blobs:
        fields = _nixl_fields(blob)
        (info,) = [value for tag, value in fields if tag == b"c"]
        address = read_worker_address(info)
        assert write_worker_address(address) == info
        regions = [value for tag, value in fields[10:]]
        for region in regions:
            key = read_remote_key(region[24:], md_indices=address.md_indices)
            assert write_remote_key(key) == region[24:]
            keys.append(key)
        addresses.append(address)
    assert len(keys) == 4 and len({a.uuid for a in addresses}) == 2
    assert addresses[0].shape() == addresses[1].shape()  # one process, one configuration
    assert len({k.shape() for k in keys}) == 1
    default = all(os.environ.get(k) == v for k, v in (("UCX_NET_DEVICES", "lo"), ("UCX_MODULES", "^ib"))) and not any(
        k in os.environ for k in ("UCX_TLS", "UCX_ADDRESS_VERSION", "UCX_ADDRESS_DEBUG_INFO", "UCX_UNIFIED_MODE")
    )
    if default:  # the sample's configuration: its form (attributes aside: they depend on the machine)
        assert addresses[0].shape(attributes=False) == read_worker_address(SAMPLE_ADDRESS).shape(attributes=False)
        assert keys[0].shape() == read_remote_key(SAMPLE_KEY).shape()


# -- refusals -------------------------------------------------------------------------------------


@pytest.mark.parametrize("blob", [SAMPLE_ADDRESS, *REAL_ADDRESSES.values()], ids=["sample", *sorted(REAL_ADDRESSES)])
def test_every_truncation_of_an_address_is_refused(blob):
    for end in range(len(blob)):
        assert refused(read_worker_address, blob[:end]).offset <= end
    refused(read_worker_address, blob + b"\x00")


@pytest.mark.parametrize("blob", [SAMPLE_KEY, DUMMY_KEY])
def test_every_truncation_of_a_key_is_refused(blob):
    for end in range(len(blob)):
        assert refused(read_remote_key, blob[:end]).offset <= end
    assert refused(read_remote_key, blob + b"\x00").offset == len(blob)


@pytest.mark.parametrize("value", [0xDF, 0x7F])
def test_known_crash_address_header(value):
    # A child loading these died of SIGABRT (ucp_address_unpack's version assertion).
    assert refused(read_worker_address, bytes((value,)) + SAMPLE_ADDRESS[1:]).offset == 0


def test_known_crash_tcp_address_length():
    # Offset 72: the tcp interface address's length and LAST flag (0x82); 0x00 and 0x80 killed a child
    # with SIGSEGV (a tcp endpoint without an address). Every other value is refused.
    assert SAMPLE_ADDRESS[72] == 0x82
    for value in set(range(256)) - {0x82}:
        refused(read_worker_address, SAMPLE_ADDRESS[:72] + bytes((value,)) + SAMPLE_ADDRESS[73:])


@pytest.mark.parametrize("value", [0x80, 0x7F, 0xFF, 0x40])
def test_known_crash_key_md_map_top_byte(value):
    # md_map's top byte: memory domains 56..63 without their parts (SIGSEGV in ucp_ep_rkey_unpack).
    refused(read_remote_key, SAMPLE_KEY[:7] + bytes((value,)) + SAMPLE_KEY[8:])


@pytest.mark.parametrize("blob", [SAMPLE_ADDRESS, *REAL_ADDRESSES.values()], ids=["sample", *sorted(REAL_ADDRESSES)])
def test_single_byte_mutations_of_an_address(blob):
    """Every accepted mutation changes only a per-process value, once compared with this process's own
    form as a peer check does (read, then equal :meth:`shape`); the reader alone also accepts changed
    transport attributes and md indices, never a length, count, flag or checksum, and the shape then
    differs. Every per-process byte may take any value (the worker name's, any printable one)."""
    original = read_worker_address(blob)
    role = roles(original)
    accepted = {"content": 0, "name": 0, "attribute": 0, "index": 0}
    for offset, value, mutant in mutants(blob):
        try:
            address = read_worker_address(mutant)
        except UcxWireError as error:
            assert role[offset] != "content", f"byte {offset} := {value:#04x} (content) refused: {error}"
            assert role[offset] != "name" or not 0x20 <= value < 0x7F, f"byte {offset} := {value:#04x} (name) refused: {error}"
            continue
        assert role[offset] != "structure", f"byte {offset} := {value:#04x} ({role[offset]}) accepted"
        accepted[role[offset]] += 1
        same = address.shape() == original.shape()
        per_process = role[offset] in ("content", "name")
        assert same == per_process, f"byte {offset} := {value:#04x} ({role[offset]}): shape {'kept' if same else 'changed'}"
        assert write_worker_address(address) == mutant
    assert accepted["content"] == sum(1 for offset, _, _ in mutants(blob) if role[offset] == "content")
    if blob == SAMPLE_ADDRESS:
        # Of the md bytes only the last device's (cma's, 4 -> 5) can change alone: the others then
        # meet a neighbour's component or order.
        assert accepted["index"] == 1 and accepted["attribute"] > 0


def test_single_byte_mutations_of_the_sample_key():
    """The sample key has no per-process byte (the self memory domain's rkey is empty): nothing is
    accepted once the key is read against its address's memory domains; alone, the reader accepts md_map
    0x80 (memory domain 7, which that address does not have)."""
    mds = read_worker_address(SAMPLE_ADDRESS).md_indices
    alone = []
    for offset, value, blob in mutants(SAMPLE_KEY):
        refused(lambda b: read_remote_key(b, md_indices=mds), blob)
        try:
            key = read_remote_key(blob)
        except UcxWireError:
            continue
        alone.append((offset, value, key.shape()))
    assert alone == [(0, 0x80, (0x80, 0, (0,), "unknown"))]


def test_random_multi_byte_damage_never_escapes_as_another_error():
    rng = random.Random(20261206)
    blobs = [SAMPLE_ADDRESS, *REAL_ADDRESSES.values(), UNIFIED_ADDRESS]
    for _ in range(3000):
        blob = bytearray(rng.choice(blobs))
        for _ in range(rng.randint(1, 4)):
            blob[rng.randrange(len(blob))] = rng.randrange(256)
        if rng.random() < 0.2:
            del blob[rng.randrange(len(blob)) :]
        try:
            address = read_worker_address(bytes(blob))
        except UcxWireError:
            continue
        assert write_worker_address(address) == bytes(blob)
    for _ in range(1000):
        key = bytearray(SAMPLE_KEY + bytes(rng.randrange(256) for _ in range(rng.randint(0, 6))))
        key[rng.randrange(len(key))] = rng.randrange(256)
        try:
            read_remote_key(bytes(key), mem_type=rng.choice((0, MEMORY_TYPE_CUDA)))
        except UcxWireError:
            pass


def _header(blob: bytes, header: bytes) -> bytes:
    return header + blob[1:]


@pytest.mark.parametrize(
    ("blob", "offset", "words"),
    [
        (_header(SAMPLE_ADDRESS, b"\x22"), 0, "version 2"),
        (_header(SAMPLE_ADDRESS, b"\x00"), 0, "WORKER_UUID"),
        (_header(SAMPLE_ADDRESS, b"\x60"), 0, "CLIENT_ID"),
        (_header(SAMPLE_ADDRESS, b"\xa0"), 0, "AM_ONLY"),
        (_header(REAL_ADDRESSES["UCX_ADDRESS_VERSION=v2"], b"\x61"), 0, "release nibble 6"),
        (REAL_ADDRESSES["UCX_ADDRESS_VERSION=v2"][:1] + b"\x12" + REAL_ADDRESSES["UCX_ADDRESS_VERSION=v2"][2:], 1, "does not define"),
        (SAMPLE_ADDRESS[:1] + bytes(8) + SAMPLE_ADDRESS[9:], 1, "uuid 0"),
        (SAMPLE_ADDRESS[:9] + b"\xff", 9, "without devices"),
        (SAMPLE_ADDRESS[:9] + b"\x20" + SAMPLE_ADDRESS[10:], 9, "ALLOC/REG"),
        (SAMPLE_ADDRESS[:38] + b"\x00" + SAMPLE_ADDRESS[39:], 54, "carries self"),
        (SAMPLE_ADDRESS[:39] + b"\x8e" + SAMPLE_ADDRESS[40:], 39, "LAST on a real device"),
        (SAMPLE_ADDRESS[:11] + b"\x64\x75" + SAMPLE_ADDRESS[13:], 11, "no UCX 1.23.0 transport"),
        (SAMPLE_ADDRESS[:27] + b"\x43" + SAMPLE_ADDRESS[28:], 25, "does not define"),
        (SAMPLE_ADDRESS[:17] + b"\x00\x00\x00\x00" + SAMPLE_ADDRESS[21:], 17, "bandwidth"),
        (SAMPLE_ADDRESS[:29] + b"\xc8" + SAMPLE_ADDRESS[30:], 29, "endpoint addresses"),
        (SAMPLE_ADDRESS[:-2] + b"\x86\x80", len(SAMPLE_ADDRESS) - 2, "release-version device"),
        (SAMPLE_ADDRESS[:-1] + b"\x00", len(SAMPLE_ADDRESS) - 1, "release-version device length"),
    ],
)
def test_address_refusals_name_the_offset(blob, offset, words):
    error = refused(read_worker_address, blob)
    assert error.offset == offset and words in error.reason, error


@pytest.mark.parametrize(
    ("blob", "kwargs", "offset", "words"),
    [
        (SAMPLE_KEY[:8] + b"\x01" + SAMPLE_KEY[9:], {}, 8, "memory type 1 (cuda)"),
        (SAMPLE_KEY[:8] + b"\x09" + SAMPLE_KEY[9:], {}, 8, "does not read"),
        (SAMPLE_KEY, {"mem_type": MEMORY_TYPE_CUDA}, 8, "expected 1"),
        (SAMPLE_KEY[:-1], {}, 10, "system device"),
        (SAMPLE_KEY[:-1] + b"\x02", {}, 10, "host memory"),
        (SAMPLE_KEY[:-1] + b"\xff\x00", {}, 11, "after the unknown system device"),
        (DUMMY_KEY + b"\xff", {}, 9, "dummy key"),
        (SAMPLE_KEY, {"md_indices": {1, 2}}, 0, "memory domain 0"),
        (SAMPLE_KEY[:8] + b"\x01\x00\x02" + b"\x03\x10\x20\x01\x10\x20", {"mem_type": 1}, 14, "ascending"),
        (SAMPLE_KEY[:8] + b"\x01\x00\x02" + b"\x03\x10\x20\x01\x10", {"mem_type": 1}, 14, "not whole"),
        (SAMPLE_KEY[:8] + b"\x01\x00\x02" + b"\x40\x10\x20", {"mem_type": 1}, 11, "below 64"),
        (SAMPLE_KEY[:8] + b"\x01\x00\x40", {"mem_type": 1}, 10, "below 64"),
    ],
)
def test_key_refusals_name_the_offset(blob, kwargs, offset, words):
    error = refused(lambda b: read_remote_key(b, **kwargs), blob)
    assert error.offset == offset and words in error.reason, error


def test_a_cuda_key_with_a_system_device_reads_when_asked_for():
    # Read per ucp_rkey.c (no GPU here to make a real one): sys_dev 2, distances to devices 0 and 3.
    blob = SAMPLE_KEY[:8] + b"\x01" + b"\x02\xaa\xbb" + b"\x02" + b"\x00\x10\x20\x03\x11\x21"
    key = read_remote_key(blob, mem_type=MEMORY_TYPE_CUDA)
    assert key.sys_dev == SysDevice(2, (Distance(0, 0x10, 0x20), Distance(3, 0x11, 0x21)))
    assert key.shape() == (1, 1, (2,), "device") and write_remote_key(key) == blob
    refused(read_remote_key, blob)  # host memory expected by default


def test_limits_on_devices_and_transports():
    assert refused(lambda b: read_worker_address(b, max_devices=4), SAMPLE_ADDRESS).offset == 149
    assert refused(lambda b: read_worker_address(b, max_transports=2), SAMPLE_ADDRESS).offset == 75 + 10


# -- writing --------------------------------------------------------------------------------------


def test_endpoint_addresses_only_when_asked_for():
    sample = read_worker_address(SAMPLE_ADDRESS)
    tcp = sample.devices[1].transports[0]
    eps = (EpAddress(b"\x01\x02\x03", 0), EpAddress(b"", 5))
    devices = list(sample.devices)
    devices[1] = Device(1, devices[1].address, (Transport(tcp.name_csum, tcp.info, tcp.address, eps),))
    address = WorkerAddress(1, 0x2, sample.uuid, tuple(devices))
    blob = write_worker_address(address)
    assert read_worker_address(blob, ep_addresses=True) == address
    assert refused(read_worker_address, blob).offset == 72
    assert write_worker_address(read_worker_address(blob, ep_addresses=True)) == blob


def test_v2_extended_lengths_round_trip_and_must_be_canonical():
    sample = read_worker_address(REAL_ADDRESSES["UCX_ADDRESS_VERSION=v2"])
    devices = list(sample.devices)
    devices[1] = Device(1, bytes(40), devices[1].transports, num_paths=2, sys_dev=3)  # tcp on a 40-byte device address
    address = WorkerAddress(2, sample.flags, sample.uuid, tuple(devices))
    blob = write_worker_address(address)
    assert read_worker_address(blob) == address
    at = blob.index(bytes((0x1F | 0x40 | 0x20, 40)))
    refused(read_worker_address, blob[: at + 1] + b"\x1e" + blob[at + 2 :])  # 30 needs no extension


@pytest.mark.parametrize(
    "change",
    [
        lambda a: WorkerAddress(3, a.flags, a.uuid, a.devices),
        lambda a: WorkerAddress(1, 0x3, a.uuid, a.devices),  # DEBUG_INFO without a name
        lambda a: WorkerAddress(1, a.flags, a.uuid, ()),
        lambda a: WorkerAddress(1, a.flags, a.uuid, (Device(64, b"", a.devices[0].transports),)),
        lambda a: WorkerAddress(1, a.flags, a.uuid, (Device(0, bytes(32), a.devices[0].transports),)),
        lambda a: WorkerAddress(2, a.flags, a.uuid, a.devices),  # v1 attributes in a v2 address
        lambda a: WorkerAddress(1, a.flags | 0x4, a.uuid, a.devices),  # CLIENT_ID
        lambda a: WorkerAddress(1, a.flags, 1 << 64, a.devices),
        lambda a: WorkerAddress(1, a.flags, a.uuid, (Device(0, b"", a.devices[0].transports, num_paths=0),)),
    ],
)
def test_writing_refuses_what_the_format_cannot_hold(change):
    with pytest.raises(ValueError):
        write_worker_address(change(read_worker_address(SAMPLE_ADDRESS)))


@pytest.mark.parametrize(
    "key",
    [
        RemoteKey(3, 0, ((0, b""),), SysDevice(None)),
        RemoteKey(3, 0, ((1, b""), (0, b"")), SysDevice(None)),
        RemoteKey(1, 0, ((0, b""),), None),
        RemoteKey(0, 0, (), SysDevice(None)),
        RemoteKey(1, 0, ((0, bytes(256)),), SysDevice(None)),
    ],
)
def test_writing_refuses_an_inconsistent_key(key):
    with pytest.raises(ValueError):
        write_remote_key(key)
