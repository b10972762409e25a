"""End to end: `kvpolicy demo` resolves each model's runtime and moves its KV cache between two
processes through NIXL; the decode side generates exactly what one process generates."""

from __future__ import annotations

import json

import pytest

from tests.support.nixl import requires_nixl

pytest.importorskip("transformers", reason="the end-to-end demo needs kvpolicy[demo] (transformers)")
pytest.importorskip("rich", reason="the end-to-end demo needs kvpolicy[demo] (rich)")

from kvpolicy.cli import main  # noqa: E402  (after the importorskips: the demo needs transformers and rich)

ARGS = ["demo", "--model-size", "tiny", "--prompt-len", "18", "--new-tokens", "6", "--tokens-per-block", "4", "--format", "json"]


@pytest.fixture(scope="module")
def demo_run(capsys_module, stderr_module):
    code = main(ARGS)
    out = capsys_module()
    return code, [json.loads(line) for line in out.splitlines() if line.startswith("{")]


@pytest.fixture(scope="module")
def stderr_module():
    """What the demo and its worker processes write to file descriptor 2 during the module's run."""
    import os
    import sys
    import tempfile

    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile(mode="w+b") as sink:
        os.dup2(sink.fileno(), 2)
        try:
            yield lambda: (sink.seek(0), sink.read().decode("utf-8", "replace"))[1]
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)


@pytest.fixture(scope="module")
def capsys_module():
    import io
    import sys

    buffer = io.StringIO()
    real = sys.stdout

    def read() -> str:
        sys.stdout = real
        return buffer.getvalue()

    sys.stdout = buffer
    yield read
    sys.stdout = real


@requires_nixl
def test_a_normal_run_prints_no_warning(demo_run, stderr_module):
    # The key folder is the workers' allow-list: it lives until they stopped, so nothing warns.
    code, rows = demo_run
    assert code == 0 and rows
    written = stderr_module()
    assert "WARNING" not in written.upper() and "cannot be read" not in written, written[-2000:]


@requires_nixl
def test_every_model_matches_single_process_generate(demo_run):
    code, rows = demo_run
    assert [r["architecture"] for r in rows] == ["LlamaForCausalLM", "Gemma3ForCausalLM", "MistralForCausalLM"]
    for row in rows:
        assert row["tokens_match"] is True, row
        assert row["max_logprob_diff"] <= 1e-5
        assert row["runtime"] == "PYTHON" and row["backend"] == "NIXL"
        assert row["bytes"] > 0 and row["gbps"] > 0 and row["descriptors"] >= 1
        assert len(row["tokens"]) == 6
    assert code == 0


@requires_nixl
def test_runtime_was_decided_by_the_models_own_config(demo_run):
    _, rows = demo_run
    decided = {r["architecture"]: r["decided_by"] for r in rows}
    assert decided == {
        "LlamaForCausalLM": "runtime-preference[LlamaForCausalLM]",
        "Gemma3ForCausalLM": "runtime-preference[Gemma3ForCausalLM]",
        "MistralForCausalLM": "runtime-default-python",
    }
    # Each worker resolved its own config and agreed.
    assert all(r["worker_decided_by"] == r["decided_by"] for r in rows)


@requires_nixl
def test_second_request_receives_only_the_blocks_it_lacks(demo_run):
    _, rows = demo_run
    for row in rows:
        reuse = row["prefix_reuse"]
        assert reuse["tokens_match"] is True
        assert 0 < reuse["blocks_received"] < reuse["blocks_total"]
        assert reuse["bytes"] < row["bytes"]


def test_ucx_stops_before_any_worker_starts(capsys, monkeypatch):
    import kvpolicy.demo.disagg as disagg

    def no_workers(*args, **kwargs):
        raise AssertionError("a worker was started")

    monkeypatch.setattr(disagg, "Worker", no_workers)
    code = main(["demo", "--backend", "UCX", "--model-size", "tiny"])
    out = capsys.readouterr().out
    assert code == 1
    assert "error[python-requires-nixl]" in out
    assert "set cache_transceiver_config.transceiver_runtime to CPP" in out
    assert "stopped before starting any worker" in out


def test_runtime_without_installed_transceiver_stops_early(capsys, monkeypatch):
    import kvpolicy.demo.disagg as disagg

    monkeypatch.setattr(disagg, "Worker", lambda *a, **k: (_ for _ in ()).throw(AssertionError("worker started")))
    code = main(["demo", "--backend", "UCX", "--policy-version", "2026.08.11", "--arch", "LlamaForCausalLM"])
    out = capsys.readouterr().out
    assert code == 1
    assert "transceiver_runtime=CPP (decided by rule 'runtime-default-cpp'" in out
