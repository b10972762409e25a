"""open_transceiver: from a resolution to a transceiver, or an error that says how to change it."""

from __future__ import annotations

import re
import subprocess
import sys
from types import SimpleNamespace

import pytest

import kvpolicy
from kvpolicy.transports import (
    BlockPool,
    KVLayout,
    RequestState,
    TransceiverSelectionError,
    open_transceiver,
    selection,
)

from .conftest import requires_nixl

LAYOUT = KVLayout(num_layers=2, kv_heads=2, tokens_per_block=4, head_dim=8)


@pytest.fixture(scope="module")
def pool():
    return BlockPool(LAYOUT, 8)


def test_importing_kvpolicy_never_imports_torch_nixl_or_zmq():
    code = "import sys, kvpolicy, kvpolicy.transports; print([m for m in ('torch', 'nixl', 'zmq') if m in sys.modules])"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    assert out.stdout.strip() == "[]"


@requires_nixl
def test_python_nixl_resolution_opens_the_nixl_transceiver(pool):
    resolution = kvpolicy.resolve(architecture="LlamaForCausalLM", backend="NIXL", kv_transfer_timeout_ms=1500)
    assert resolution.runtime == "PYTHON"
    with open_transceiver(resolution, pool, name="selected", allowed_peers=[]) as transceiver:
        assert (transceiver.runtime, transceiver.backend) == ("PYTHON", "NIXL")
        assert transceiver.timeout_s == 1.5
        assert transceiver.registrations == 1
        assert transceiver.address.endswith("@127.0.0.1:" + transceiver.address.rsplit(":", 1)[1])
    assert transceiver.registrations == 0


def test_runtime_without_an_installed_transceiver_names_decision_rule_and_fix(pool, monkeypatch):
    monkeypatch.setattr(selection, "entry_points", lambda group: [])
    # From 1.4 (#17495) a left-out use_kv_cache_manager_v2 is V2, which the C++ transceiver cannot serve.
    resolution = kvpolicy.resolve(architecture="LlamaForCausalLM", backend="NIXL", transceiver_runtime="CPP", kv_cache_manager="V1")
    assert resolution.ok and resolution.runtime == "CPP"
    with pytest.raises(TransceiverSelectionError) as caught:
        open_transceiver(resolution, pool)
    message = str(caught.value)
    assert "transceiver_runtime=CPP" in message
    assert resolution.decided_by["transceiver_runtime"] in message
    assert "transceiver_runtime='PYTHON'" in message
    assert "kvpolicy.transceivers" in message
    assert caught.value.decision == "transceiver_runtime"


def test_resolution_with_errors_is_refused_with_its_diagnostics(pool):
    resolution = kvpolicy.resolve(architecture="LlamaForCausalLM", backend="UCX", transceiver_runtime="PYTHON")
    assert not resolution.ok
    with pytest.raises(TransceiverSelectionError) as caught:
        open_transceiver(resolution, pool)
    for error in resolution.errors:
        assert error.id in str(caught.value)


def test_null_timeout_is_refused(pool):
    resolution = kvpolicy.resolve(architecture="LlamaForCausalLM", backend="NIXL", kv_transfer_timeout_ms=None)
    with pytest.raises(TransceiverSelectionError, match="timeout"):
        open_transceiver(resolution, pool)
    # Even a resolution that let a null timeout through is refused by the transport itself.
    lenient = SimpleNamespace(errors=[], ok=True, context={"kv_transfer_timeout_ms": None})
    with pytest.raises(TransceiverSelectionError, match="finite timeout"):
        selection.timeout_from(lenient)


def test_disaggregation_off_is_an_error(pool):
    # A real resolution that turns transfer off: no cache-transceiver backend at all.
    resolution = kvpolicy.resolve(backend=None)
    assert resolution.ok and resolution.runtime is None and resolution.backend is None
    with pytest.raises(TransceiverSelectionError, match=rf"policy version {re.escape(resolution.policy_version)}\): KV-cache transfer is off.*Set backend="):
        open_transceiver(resolution, pool)


def test_other_runtimes_come_from_the_entry_point_group(pool, monkeypatch):
    opened = []

    class EntryPoint:
        name = "CPP:NIXL"

        def load(self):
            return lambda resolution, pool, **options: opened.append((resolution.runtime, options)) or "cpp"

    monkeypatch.setattr(selection, "entry_points", lambda group: [EntryPoint()] if group == "kvpolicy.transceivers" else [])
    resolution = kvpolicy.resolve(architecture="LlamaForCausalLM", backend="NIXL", transceiver_runtime="CPP", kv_cache_manager="V1")
    assert open_transceiver(resolution, pool, flavour=1) == "cpp"
    assert opened == [("CPP", {"flavour": 1})]


@requires_nixl
def test_cancel_is_refused_while_a_write_is_in_flight(pool):
    """White-box: CMA writes finish inside the post call, so an in-flight write is staged here."""
    from kvpolicy.transports import NixlTransceiver

    with NixlTransceiver(pool, name="inflight", timeout_s=5, allowed_peers=[]) as transceiver:
        handle = transceiver.send("busy", [0, 1])

        def stage_write(in_flight: int):
            def run():
                offer = transceiver._sender.offers["busy"]
                offer.writes = in_flight
                if in_flight:
                    offer.handle._state = RequestState.TRANSFERRING
                else:
                    transceiver._sender.settle(offer)

            transceiver._loop.submit(run).result(5)

        stage_write(1)
        assert transceiver.cancel("busy") is False
        assert not handle.done and handle.state is RequestState.TRANSFERRING
        stage_write(0)  # NIXL reports the write finished: now the pages may go
        with pytest.raises(kvpolicy.transports.TransferError) as caught:
            handle.wait(5)
        assert caught.value.state is RequestState.CANCELLED
