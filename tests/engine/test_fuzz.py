"""No input gives anything but a policy, a resolution, a PolicyError or a ContextError.

Hypothesis drives the loader with mutations of the shipped files and arbitrary TOML documents, and
the resolver with arbitrary field values. ``bench/fuzz.py`` runs the same targets under atheris
(coverage-guided) for a bounded time.
"""

from __future__ import annotations

from typing import Any

import tomlkit
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import kvpolicy
from kvpolicy import ContextError, PolicyError
from kvpolicy.fuzzing import load_target, resolve_target
from kvpolicy.loader import shipped_root

SHIPPED = [p.read_bytes() for p in sorted(shipped_root().glob("2026.*.toml")) if not p.name.endswith(".cases.toml")]
NEWEST = kvpolicy.load()
SETTINGS = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


@st.composite
def mutated(draw: Any) -> bytes:
    raw = bytearray(draw(st.sampled_from(SHIPPED)))
    for _ in range(draw(st.integers(1, 6))):
        kind = draw(st.sampled_from(("flip", "delete", "insert", "splice")))
        at = draw(st.integers(0, len(raw) - 1))
        if kind == "flip":
            raw[at] = draw(st.integers(0, 255))
        elif kind == "delete":
            del raw[at : at + draw(st.integers(1, 40))]
        elif kind == "insert":
            raw[at:at] = draw(st.sampled_from([b"[", b"]", b"{", b'"', b"=", b"\n[[constraints]]\n", b"not = ", b"#", b"'''"]))
        else:
            other = draw(st.sampled_from(SHIPPED))
            start = draw(st.integers(0, len(other) - 1))
            raw[at:at] = other[start : start + draw(st.integers(1, 200))]
    return bytes(raw)


toml_values = st.recursive(
    st.one_of(st.booleans(), st.integers(-5, 5), st.text(max_size=8), st.sampled_from(["NIXL", "PYTHON", "auto", "V2"])),
    lambda children: st.one_of(st.lists(children, max_size=3), st.dictionaries(st.text(min_size=1, max_size=6), children, max_size=3)),
    max_leaves=12,
)


@st.composite
def documents(draw: Any) -> bytes:
    keys = st.sampled_from(["schema", "version", "summary", "source", "features", "decisions", "constraints", "x"])
    data = draw(st.dictionaries(keys, toml_values, max_size=7))
    try:
        return tomlkit.dumps(data).encode()
    except Exception:  # tomlkit refuses some shapes; any bytes still make a fine input
        return repr(data).encode()


@SETTINGS
@given(raw=st.one_of(mutated(), documents(), st.binary(max_size=200)))
def test_loader_never_crashes(raw):
    outcome = load_target(raw)
    assert outcome in ("policy", "policy-error")


field_values = st.one_of(
    st.none(), st.booleans(), st.integers(-2, 10**6), st.floats(allow_nan=True), st.text(max_size=10),
    st.sampled_from(["NIXL", "UCX", "DEFAULT", "auto", "PYTHON", "CPP", "V1", "V2", "inflight_cancel"]),
    st.lists(st.text(max_size=6), max_size=3), st.frozensets(st.sampled_from(["inflight_cancel", "x"])),
    st.dictionaries(st.text(max_size=5), st.one_of(st.text(max_size=3), st.integers()), max_size=2),
)
field_names = st.sampled_from([
    "architecture", "pretrained_config", "backend", "transceiver_runtime", "kv_transfer_timeout_ms",
    "enable_pipelined_transfer", "kv_cache_manager", "features", "env", "kv_cache_bounce_size_mb", "bogus",
])


@SETTINGS
@given(fields=st.dictionaries(field_names, field_values, max_size=6), config=st.one_of(st.none(), field_values))
def test_resolver_never_crashes(fields, config):
    assert resolve_target(NEWEST, config, fields) in ("resolution", "context-error")


def test_targets_classify_real_outcomes():
    assert load_target(SHIPPED[-1]) == "policy"
    assert load_target(b"schema = [") == "policy-error"
    assert resolve_target(NEWEST, None, {"backend": "NIXL"}) == "resolution"
    assert resolve_target(NEWEST, None, {"backend": "nixl"}) == "context-error"
    assert issubclass(PolicyError, ValueError) and issubclass(ContextError, ValueError)
