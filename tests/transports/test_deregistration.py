"""What revocation can reach here (issue 38, item 5), measured with two real NIXL agents in two
processes: after the target deregisters a region, a peer that holds its metadata still writes into it
over UCX's CMA and TCP transports, and the write completes. So removing a key ends its control-plane
session but not, on these transports, the data-plane access it was given; docs/trust-model.md states
this residual and what a deployment needs instead (RDMA NICs, which invalidate remote keys). The test
keeps that statement true: if UCX ever enforces deregistration here, it fails and the docs must change."""

from __future__ import annotations

import pytest

from .conftest import requires_nixl

pytestmark = requires_nixl


@pytest.mark.parametrize(("label", "tls"), [("default (CMA)", None), ("tcp", "tcp")])
def test_a_deregistered_region_still_takes_a_peers_write_on_these_transports(label, tls):
    from .deregistration_probe import run

    env = {"UCX_NET_DEVICES": "lo", "UCX_MODULES": "^ib", **({"UCX_TLS": tls} if tls else {})}
    (first, landed_first, second), after = run(label, env, quiet=True)
    assert first == "DONE" and landed_first == 16  # the honest write
    assert second == "DONE" and after == 32, (label, second, after)  # landed after deregistration
