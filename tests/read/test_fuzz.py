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
from kvpolicy.read.loader import shipped_root

from tests.support.strategies import hostile_structures

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


# -- structure-aware inputs: what the 200-byte inputs above never reach ---------------------------

@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(hostile_structures())
def test_loader_bounds_structure_before_parsing(case):
    raw, beyond = case
    try:
        kvpolicy.read.loader.parse_policy(raw, "fuzz.toml")
    except PolicyError as exc:
        checks = {p.check for p in exc.problems}
        assert not beyond or checks == {"size"}, exc
        for problem in exc.problems:
            assert problem.location.line >= 1 and problem.location.column >= 1
    else:
        assert not beyond


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(size=st.integers(0, 64), limit=st.integers(1, 48))
def test_reader_size_edges(tmp_path_factory, size, limit):
    """A file of exactly the cap is read; one byte more is refused by stat, before reading."""
    from kvpolicy.read.policyfile import read_policy_bytes

    folder = tmp_path_factory.mktemp("edges")
    path = folder / "p.toml"
    path.write_bytes(b"#" * size)
    if size <= limit:
        assert read_policy_bytes(path, "p.toml", limit=limit) == b"#" * size
    else:
        try:
            read_policy_bytes(path, "p.toml", limit=limit)
        except PolicyError as exc:
            assert exc.problems[0].check == "size" and f"limited to {limit:,} bytes" in exc.problems[0].message
        else:
            raise AssertionError("a file over the cap was read")


def test_reader_refuses_special_files(tmp_path):
    import os

    from kvpolicy.read.policyfile import read_policy_bytes

    specials = {"folder.toml": lambda p: p.mkdir(), "loop.toml": lambda p: os.symlink(p.name, p)}
    if hasattr(os, "mkfifo"):
        specials["fifo.toml"] = os.mkfifo
    if os.path.exists("/dev/null"):
        specials["null.toml"] = lambda p: os.symlink("/dev/null", p)
    for name, make in specials.items():
        path = tmp_path / name
        make(path)
        try:
            read_policy_bytes(path, name, allowed=(tmp_path.parent, __import__("pathlib").Path("/dev")))
        except PolicyError as exc:
            assert exc.problems[0].check == "io" and exc.problems[0].location.path == name, name
        else:
            raise AssertionError(f"{name} was read")


@st.composite
def hostile_configs(draw: Any) -> tuple[str, str, bool]:
    """(suffix, text, whether it exceeds a bound or repeats a key) for the config reader."""
    from kvpolicy.serving.configfile import MAX_DEPTH

    kind = draw(st.sampled_from(("flow", "block", "aliases", "duplicate", "json-deep", "json-duplicate", "text")))
    if kind in ("flow", "json-deep"):
        depth = draw(st.one_of(st.integers(1, MAX_DEPTH + 2), st.integers(MAX_DEPTH, 20_000)))
        body = "[" * depth + "]" * depth
        return (".json" if kind == "json-deep" else ".yaml"), (body if kind == "json-deep" else f"a: {body}\n"), depth > MAX_DEPTH
    if kind == "block":
        depth = draw(st.integers(1, MAX_DEPTH + 40))
        return ".yaml", "".join(" " * i + "k:\n" for i in range(depth)) + " " * depth + "v\n", depth + 1 > MAX_DEPTH
    if kind == "aliases":
        fan, levels = draw(st.integers(1, 12)), draw(st.integers(1, 9))
        lines = ['l0: &l0 ["x"]']
        for level in range(1, levels + 1):
            lines.append(f"l{level}: &l{level} [" + ", ".join([f"*l{level - 1}"] * fan) + "]")
        # The reader's budget: a node counts its expanded children; every alias adds what it expands to.
        from kvpolicy.serving.configfile import MAX_EXPANDED_NODES

        sizes, spent = [2], 0
        for _ in range(levels):
            spent += fan * sizes[-1]
            sizes.append(1 + fan * sizes[-1])
        return ".yaml", "\n".join(lines) + "\n", max(sizes[-1], spent) > MAX_EXPANDED_NODES
    if kind == "duplicate":
        key = draw(st.sampled_from(["backend", "x", "1"]))
        return ".yaml", f"cache_transceiver_config:\n  {key}: a\n  other: b\n  {key}: c\n", True
    if kind == "json-duplicate":
        return ".json", '{"a": {"b": 1, "b": 2}}', True
    return ".yaml", draw(st.text(alphabet=st.sampled_from(list("ab:-[]{}&*!|>'\"\n #,?%@`\t")), max_size=300)), False


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(hostile_configs())
def test_config_reader_bounds_and_locates(tmp_path_factory, case):
    from kvpolicy.serving.configfile import ConfigFileError, read_config

    suffix, text, refused = case
    path = tmp_path_factory.mktemp("configs") / f"c{suffix}"
    path.write_text(text, encoding="utf-8")
    try:
        read_config(path, "c" + suffix)
    except ConfigFileError as exc:
        assert str(exc).startswith("c" + suffix)
        if refused:
            assert exc.line is not None and exc.line >= 1
    else:
        assert not refused
