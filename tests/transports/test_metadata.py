"""The strict reader of NIXL metadata (transports/metadata.py): nothing a peer sends reaches NIXL's
parser unless it is exactly NIXL 1.5's format, describes what the hello announced, and re-serialises
to the same bytes; the mutations that crashed NIXL (tests/transports/nixl_fixtures) are refused."""

from __future__ import annotations

import functools
import json
import struct
import threading
from pathlib import Path

import pytest

from kvpolicy.transports.metadata import (
    AgentMetadata,
    Expected,
    MetadataError,
    Region,
    Section,
    admit,
    format_supported,
    read_metadata,
    write_metadata,
)

from tests.support.nixl_blobs import REAL_ADDRESSES
from tests.support.transfer import LAYOUT

from .conftest import requires_nixl

FIXTURES = Path(__file__).parent / "nixl_fixtures"
BLOB = (FIXTURES / "nixl-1.5.1-dram-1mib.bin").read_bytes()
CRASHES = json.loads((FIXTURES / "crashes.json").read_text())["crashes"]
VALUES = (lambda b: b ^ 0xFF, lambda b: 0x00, lambda b: 0x80, lambda b: b ^ 0x01, lambda b: 0x7F)
"""The byte values every offset is mutated to (the issue's scan used these)."""


def expected_of(blob: bytes, own: bytes | None = None) -> Expected:
    """What a hello announcing exactly this metadata's agent and region would expect, on a process
    whose own metadata is ``own`` (default: ``blob``: the same UCX form)."""
    metadata = read_metadata(blob)
    (region,) = metadata.sections[0].regions
    memory = {0: "DRAM", 1: "VRAM"}[metadata.sections[0].memory_type]
    address = dict(read_metadata(own or blob).connections)["UCX"]
    return Expected(metadata.agent, ("UCX",), memory, region.address, region.length, region.device_id, address)


def with_address(blob: bytes, address: bytes) -> bytes:
    """``blob`` with another UCX worker address."""
    metadata = read_metadata(blob)
    return write_metadata(AgentMetadata(metadata.agent, (("UCX", address),), metadata.sections))


def mutations(blob: bytes):
    """(offset, value, mutated blob) for every offset and every value of :data:`VALUES` that changes it."""
    for at, old in enumerate(blob):
        for value in sorted({f(old) for f in VALUES} - {old}):
            yield at, value, blob[:at] + bytes([value]) + blob[at + 1 :]


def per_process_ranges(blob: bytes) -> list[range]:
    """Where a peer's own values may sit: its UCX worker address and each region's remote key. A
    mutation the reader accepts may only change a byte there (and, in the address, only what keeps
    its form: :func:`test_an_accepted_mutation_keeps_the_addresss_form`)."""
    found = []
    at = blob.index(b"|t\x03\x00\x00\x00\x00\x00\x00\x00UCX|c") + 15
    (length,) = struct.unpack_from("<Q", blob, at)
    found.append(range(at + 8, at + 8 + length))
    at = blob.index(b"|n\x08") + 2 + 8
    (count,) = struct.unpack_from("<Q", blob, at)
    at += 8 + 1
    for _ in range(count):
        (length,) = struct.unpack_from("<Q", blob, at)
        found.append(range(at + 8 + 24, at + 8 + length))
        at += 8 + length + 1
    return found


# ------------------------------------------------------------------------------- the format ----


def test_real_metadata_reads_field_by_field_and_writes_back_to_the_same_bytes():
    metadata = read_metadata(BLOB)
    assert metadata.agent == "decode-0"
    assert [backend for backend, _ in metadata.connections] == ["UCX"]
    assert len(metadata.connections[0][1]) == 184
    (section,) = metadata.sections
    assert (section.backend, section.memory_type, len(section.regions)) == ("UCX", 0, 1)
    assert section.regions[0].length == 1 << 20 and section.regions[0].device_id == 0
    assert write_metadata(metadata) == BLOB
    assert admit(BLOB, expected_of(BLOB)) == BLOB


def test_written_metadata_reads_back_as_itself():
    metadata = AgentMetadata(
        "p-1", (("UCX", b"\x01\x02"),), (Section("UCX", 1, (Region(0x1000, 4096, 3, b"k"), Region(0x3000, 8, 3, b""))),)
    )
    assert read_metadata(write_metadata(metadata)) == metadata


def test_every_truncation_and_any_trailing_byte_is_refused_with_its_offset():
    for n in range(len(BLOB)):
        with pytest.raises(MetadataError) as caught:
            read_metadata(BLOB[:n])
        assert 0 <= caught.value.offset <= n, (n, caught.value)
    with pytest.raises(MetadataError, match="1 bytes after the last section"):
        read_metadata(BLOB + b"|")


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda b: b.replace(b"nixlSerDes|", b"nixlSerDeZ|"), "header"),
        (lambda b: b.replace(b"Conns\x08" + b"\x00" * 7 + b"\x01", b"Conns\x08" + b"\x00" * 7 + b"\x09"), "9 backends"),
        (lambda b: b.replace(b"Agent\x08\x00", b"Agent\x00\x10"), "agent name field says 4096 bytes \\(at most 256\\)"),
        (lambda b: b[:-44] + b"\xc8" + b[-43:], "region field says 200 bytes; 36 follow"),
        (lambda b: b.replace(b"Agent\x08", b"Agent\x09"), "agent name field does not end with '\\|'"),
        (lambda b: b.replace(b"decode-0", b"decode\x00\x01"), "not printable"),
        (lambda b: b.replace(b"nixlSDList", b"nixlSDLisX"), "descriptor list marker"),
        (lambda b: b.replace(b"|t\x04" + b"\x00" * 7 + b"\x00\x00\x00\x00", b"|t\x04" + b"\x00" * 7 + b"\x02\x00\x00\x00"), "memory type 2"),
        (lambda b: b.replace(b"|n\x08" + b"\x00" * 7 + b"\x01", b"|n\x08" + b"\x00" * 7 + b"\xff"), "255 regions"),
    ],
    ids=["header", "backend count", "length over its bound", "length past the end", "length off by one", "name", "marker", "memory type", "region count"],
)
def test_each_kind_of_malformed_metadata_says_what_and_where(change, message):
    blob = change(BLOB)
    assert blob != BLOB
    with pytest.raises(MetadataError, match=message) as caught:
        read_metadata(blob)
    assert str(caught.value).startswith(f"at byte {caught.value.offset}: ")


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("agent", "decode-1", "names agent 'decode-0', not 'decode-1'"),
        ("backends", ("UCX", "GDS"), "not this deployment's"),
        ("memory_type", "VRAM", "expected one VRAM region"),
        ("address", 4096, "the hello announced the pool at 0x1000"),
        ("length", 1 << 21, "the hello announced the pool"),
        ("device_id", 1, "on device 1"),
    ],
)
def test_metadata_that_is_not_the_announced_pool_is_refused(field, value, message):
    expected = expected_of(BLOB)
    with pytest.raises(MetadataError, match=message):
        admit(BLOB, Expected(**{**expected.__dict__, field: value}))


def test_an_accepted_mutation_keeps_the_addresss_form():
    """A peer's worker address must have this process's form: a mutation of a transport's priority or
    capability flags, or of a memory-domain index, is refused (such an address made UCX pick lanes
    its target could not serve, and the target aborted); only per-process values may differ."""
    from kvpolicy.transports.ucx_wire import read_worker_address

    expected = expected_of(BLOB)
    own = read_worker_address(dict(read_metadata(BLOB).connections)["UCX"])
    for _at, _value, blob in mutations(BLOB):
        try:
            admit(blob, expected)
        except MetadataError:
            continue
        assert read_worker_address(dict(read_metadata(blob).connections)["UCX"]).form() == own.form()


def test_a_peer_running_other_transports_is_refused_with_both_forms_named():

    other = with_address(BLOB, REAL_ADDRESSES["UCX_TLS=tcp"])
    assert read_metadata(other).agent == "decode-0"
    admit(other, expected_of(other))  # alone it is well formed
    with pytest.raises(MetadataError, match=r"another form than this process's \(md0 tcp against md0 self, md1 tcp, md2 sysv"):
        admit(other, expected_of(other, own=BLOB))


def test_the_format_is_pinned_to_the_nixl_releases_it_was_checked_against():
    assert format_supported("1.5.1") is None and format_supported("1.5.0rc2") is None
    for version in ("1.6.0", "2.0", "0.9.1"):
        problem = format_supported(version)
        assert problem is not None and f"NIXL {version} is installed" in problem and "nixl==1.5.*" in problem


# --------------------------------------------------------------------------- the mutations ----


@pytest.mark.parametrize("crash", CRASHES, ids=lambda c: f"{c['offset']}-{c['field']}")
def test_every_mutation_that_crashed_nixl_is_refused_before_nixl_sees_it(crash):
    for value in crash["values"]:
        blob = BLOB[: crash["offset"]] + bytes([value]) + BLOB[crash["offset"] + 1 :]
        with pytest.raises(MetadataError):
            admit(blob, expected_of(BLOB))


def test_an_accepted_one_byte_mutation_only_ever_changes_a_peers_own_values():
    """Of every one-byte mutation (five values at every offset), what the reader lets through
    changed a byte of the worker address's or a remote key's contents, never a tag, length, count,
    name, memory type, region or flag."""
    expected, allowed = expected_of(BLOB), per_process_ranges(BLOB)
    accepted, refused = [], 0
    for at, value, blob in mutations(BLOB):
        try:
            assert admit(blob, expected) == blob
        except MetadataError:
            refused += 1
            continue
        accepted.append((at, value))
    outside = [(at, value) for at, value in accepted if not any(at in r for r in allowed)]
    assert not outside, f"accepted mutations outside a peer's own values: {outside[:10]}"
    assert accepted and refused, (len(accepted), refused)  # a peer's own values do vary; the rest may not


@requires_nixl
def test_fuzz_every_one_byte_mutation_and_truncation_of_live_metadata_is_refused_or_loads():
    """The gate's fuzz: a live agent's metadata (so UCX connects as a real load would), every offset
    mutated to five values and every truncation. The reader refuses it, or a probe child loads it:
    none may crash NIXL in the loading process."""
    from kvpolicy.transports import NixlSettings
    from kvpolicy.transports.probe import MetadataProbe

    from .attackers import LiveAgent

    live = LiveAgent("live-0", 64 * LAYOUT.block_bytes)
    blob = live.metadata
    expected = expected_of(blob)
    candidates = [(f"{at}:{value}", mutated) for at, value, mutated in mutations(blob)]
    candidates += [(f"truncated:{n}", blob[:n]) for n in range(len(blob))]
    passed = {}
    for name, mutated in candidates:
        try:
            passed[name] = admit(mutated, expected)
        except MetadataError:
            pass
    assert 0 < len(passed) < len(candidates) // 2, (len(passed), len(candidates))
    verdicts: dict[str, str | None] = {}
    done = threading.Event()

    def answered(name: str, verdict: str | None) -> None:
        verdicts[name] = verdict
        if len(verdicts) == len(passed):
            done.set()

    with MetadataProbe(NixlSettings(), max_running=4, max_waiting=len(passed), per_owner=len(passed), cache_size=1) as probe:
        for name, mutated in passed.items():
            probe.start(mutated, functools.partial(answered, name))
        assert done.wait(300), f"{len(passed) - len(verdicts)} probes never answered"
    live.close()
    crashed = {name: verdict for name, verdict in verdicts.items() if verdict and ("crashed" in verdict or "exited" in verdict)}
    assert not crashed, f"{len(crashed)} of {len(passed)} accepted mutations crashed NIXL: {dict(list(crashed.items())[:5])}"


@requires_nixl
def test_a_transceiver_refuses_to_start_under_a_nixl_whose_format_it_does_not_read(monkeypatch, tmp_path):
    from kvpolicy.transports import BlockPool, NixlTransceiver, transceiver

    monkeypatch.setattr(transceiver, "nixl_version", lambda: "1.6.0")
    with pytest.raises(RuntimeError, match=r"NIXL 1\.6\.0 is installed; kvpolicy reads the metadata format of NIXL 1\.5 only"):
        NixlTransceiver(BlockPool(LAYOUT, 4, huge_pages=False), name="pinned", allowed_peers=[])
