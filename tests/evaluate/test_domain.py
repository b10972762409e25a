"""The domain as a product of dimensions."""

from __future__ import annotations

from kvpolicy.evaluate.domain import domain_of
from kvpolicy.read.loader import parse_policy

from tests.support.policies import three_decisions

POLICY = three_decisions(
    features={"f1": None},
    backend_auto="DEFAULT",
    backend="""
[[decisions.backend.conditional]]
id = "b-env"
when = { env.E1 = "2" }
value = "UCX"

[[decisions.backend.requirement]]
id = "b-req"
when = { env.E1 = "1" }
value = "UCX"
""",
)


def test_a_variable_read_always_and_when_auto_keeps_every_named_value() -> None:
    policy = parse_policy(POLICY.encode(), "p.toml")
    domain = domain_of(policy)
    dims = {d.name: d.values for d in domain.dimensions()}
    assert dims["env:E1"] == ("", "1", "2")
    assert set(domain.env_always["E1"]) == {"", "1", "2"}
    # contexts() still enumerates every value where the backend is auto.
    seen = {ctx["env"].get("E1", "") for ctx in domain.contexts() if ctx["backend"] == "DEFAULT"}
    assert seen == {"", "1", "2"}


def test_dimensions_cover_every_input() -> None:
    policy = parse_policy(POLICY.encode(), "p.toml")
    names = [d.name for d in domain_of(policy).dimensions()]
    assert names[0] == "model"
    assert {"backend", "transceiver_runtime", "kv_cache_manager", "kv_transfer_timeout_ms", "env:E1"} <= set(names)
