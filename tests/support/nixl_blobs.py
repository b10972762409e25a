"""NIXL metadata and UCX addresses the transfer layer's tests feed its readers: real UCX worker
addresses, and one-byte mutations of a real transceiver's NIXL metadata that kill NIXL's parser."""

from __future__ import annotations


def field_value(blob: bytes, marker: bytes) -> int:
    """Offset of the value of the serializer's field that ``marker`` ends with (tag, 8-byte length,
    value)."""
    return blob.index(marker) + len(marker) + 8


def set_byte(blob: bytes, at: int, value: int) -> bytes:
    assert blob[at] != value, (at, value)
    return blob[:at] + bytes([value]) + blob[at + 1 :]


# (name, where, new byte, how it dies). Found by bench/probe.py --search on NIXL 1.5.1 / UCX 1.23:
# nearly every value of the descriptor list's 4-byte memory type but a valid type crashes; 224 of 255
# values of the UCX worker address's first byte abort; 180 of 255 values of the fourth-last byte (in
# the packed remote key) crash. These three crashed every time they were tried (8 forked, 8 spawned
# and 4 plain processes each); some others crash only sometimes (0x80 at the fourth-last byte: 7 of 8
# forked children, 0 of 8 spawned, 4 of 4 plain), and are not used here.
CRASHES = (
    ("memory type < 0", lambda b: field_value(b, b"nixlSDList|t") + 3, lambda old: 0x80, "SIGSEGV"),
    ("UCX worker address header", lambda b: field_value(b, b"UCX|c"), lambda old: old ^ 0xFF, "SIGABRT"),
    ("packed remote key", lambda b: len(b) - 4, lambda old: 0x40, "SIGSEGV"),
)


def crashing_mutants(blob: bytes) -> list[tuple[str, int, int, bytes, str]]:
    """(name, offset, byte, mutated blob, expected signal) per rule, for this blob."""
    out = []
    for name, where, value, dies in CRASHES:
        at = where(blob)
        byte = value(blob[at])
        out.append((name, at, byte, set_byte(blob, at, byte), dies))
    return out


#: Real UCX worker addresses (NIXL 1.5.1, UCX 1.23.0), each from a fresh process with the variables named.
_REAL_HEX = {
    # More real addresses, each from a fresh process (so uuids and ports differ) with the variables shown.
    "UCX_TLS=tcp": "205874b9a5c719b8c6000e0102492419a899df92fef9ffffefcf1917b75138539e3e4bd7e0373701132300828e938780",
    "UCX_TLS=self,tcp,cma": (
        "20a6511c2ef0eaadfb0000637577cc2b320040975000000000004f03c0885ad1188f63352535010e0102492419a899df92fef9ffffefcf1917b75138539e3e4bd7e03737"
        "0113230082a7890208492419a899df927e478bbd37063600242e5077ccab3300922100848c7d00008780"
    ),
    "UCX_TLS=^cma": (
        "200854a047fb97f76e0000637577cc2b320040975000000000004f03c088738f12b4c7d60fae010e0102492419a899df92fef9ffffefcf1917b75138539e3e4bd7e03737"
        "011323008298230208492419a899df927e8d5377cc2b320000705077ccab33004f23c0882e006901000000000308492419a899df927ea7d377cc2b320000705077ccab33"
        "004f23c0889a7d0080030000c08780"
    ),
    "UCX_NET_DEVICES=all": (
        "2044c179ef5088d5a70000637577cc2b320040975000000000004f03c0886ad14918a039b1e001060002c0000202cf1917b751389763344bd7e037370013230082d2d101"
        "0e0102492419a899df92fef9ffffefcf1917b75138539e3e4bd7e03737011323008285010208492419a899df927e8d5377cc2b320000705077ccab33004f23c0881c0069"
        "01000000000308492419a899df927ea7d377cc2b320000705077ccab33004f23c08853780000040000c00408492419a899df927e478bbd37063600242e5077ccab330092"
        "210084537800008780"
    ),
    "UCX_ADDRESS_DEBUG_INFO=y": (
        "30f923a20147acc11a08766d3a33303738390000637577cc2b320040975000000000004f03c088cbdac890cd921b41010e0102492419a899df92fef9ffffefcf1917b751"
        "38539e3e4bd7e03737011323008295e70208492419a899df927e8d5377cc2b320000705077ccab33004f23c08812006901000000000308492419a899df927ea7d377cc2b"
        "320000705077ccab33004f23c08845780080030000c00408492419a899df927e478bbd37063600242e5077ccab330092210084457800008780"
    ),
    "UCX_ADDRESS_VERSION=v2": (
        "7102eb95818890fb8d92000063754426000080001b0388622f4a5b946f24bf010e0102492419a899df92fef9ffffefcf190c015a0180008b0082957d0208492419a899df"
        "927e8d5344e5430081009b03880d006901000000000308492419a899df927ea7d344e5430081009b03883e780080030000c00488492419a899df927e478bfb5543000000"
        "9900843e780000"
    ),
    "UCX_ADDRESS_VERSION=v2 UCX_ADDRESS_DEBUG_INFO=y": (
        "7103dbde1129c585646808766d3a3330383130000063754426000080001b03887746413e9aaf1329010e0102492419a899df92fef9ffffefcf190c015a0180008b008282"
        "2d0208492419a899df927e8d5344e5430081009b038821006901000000000308492419a899df927ea7d344e5430081009b03885a780080030000c00488492419a899df92"
        "7e478bfb55430000009900845a780000"
    ),
}
REAL_ADDRESSES = {env: bytes.fromhex(hexes) for env, hexes in _REAL_HEX.items()}
