"""The analysis behind the precedence and safety rules is exact: on every policy it agrees with
brute force over the full domain (every context class, evaluated by the resolver)."""

from __future__ import annotations

import kvpolicy
import pytest
from hypothesis import HealthCheck, given, settings
from kvpolicy.read.loader import parse_policy

from tests.support.analysis import compare
from tests.support.policies import three_decisions
from tests.support.strategies import policies


# The first and the newest shipped versions: the newest uses every construct the language has
# (requested.*, adjustments, env not-matchers); each walks its whole domain (up to millions of
# contexts). The random policies below cover the language exhaustively at small sizes.
@pytest.mark.parametrize("version", ["2026.07.09", "2026.09.10"])
def test_exact_on_shipped_policies(version):
    compare(kvpolicy.load(version=version).policy)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(policies())
def test_exact_on_random_policies(text):
    compare(parse_policy(text.encode(), "random.toml"))


#: An adjustment is the only rule that reads the architecture: it rewrites the manager for ArchA.
ADJUSTED_BY_MODEL_ONLY = three_decisions(
    backend_auto="DEFAULT",
    runtime_inputs=["backend"],
    manager_inputs=["transceiver_runtime"],
    manager="""
[[decisions.kv_cache_manager.adjustment]]
id = "arch-a-v2"
when = { architecture = "ArchA" }
value = "V2"
""",
)


def test_an_adjustment_that_alone_reads_the_architecture_is_seen_to_decide():
    policy = parse_policy(ADJUSTED_BY_MODEL_ONLY.encode(), "adjusted.toml")
    assert kvpolicy.PolicySet(policy).resolve(architecture="ArchA", backend="NIXL").decided_by["kv_cache_manager"] == "arch-a-v2"
    compare(policy)
