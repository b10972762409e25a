"""Whether NIXL loads here, for the tests that move data (the transfer layer's and the demo's).

UCX reads its environment when NIXL first loads it, so the loopback / no-InfiniBand settings are made
here, on import, before any test imports nixl; child processes inherit them.
"""

from __future__ import annotations

import os

os.environ.setdefault("UCX_NET_DEVICES", "lo")
os.environ.setdefault("UCX_MODULES", "^ib")  # without it, processes with an agent segfault at exit
os.environ.setdefault("UCX_CMA_SEG_SIZE", "8M")
os.environ.setdefault("NIXL_LOG_LEVEL", "WARN")

import pytest  # noqa: E402  (after the UCX settings: UCX reads them when NIXL first loads)

from kvpolicy.transports import nixl_available  # noqa: E402  (after the UCX settings: it loads NIXL)

NIXL_OK, NIXL_WHY = nixl_available()

requires_nixl = pytest.mark.skipif(not NIXL_OK, reason=f"NIXL cannot load here: {NIXL_WHY}")
"""Mark for tests that move data: they skip (with the reason) only where NIXL cannot load."""
