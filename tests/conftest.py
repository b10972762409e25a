"""Settings for the whole suite."""

from __future__ import annotations

import os
import tempfile

import pytest


@pytest.fixture(autouse=True, scope="session")
def _private_cache_dir():
    """Every test (and every process a test starts) uses a cache folder of its own session, never
    the user's: set before any test runs, removed after."""
    with tempfile.TemporaryDirectory(prefix="kvpolicy-cache-") as folder:
        previous = os.environ.get("KVPOLICY_CACHE_DIR")
        os.environ["KVPOLICY_CACHE_DIR"] = folder
        yield folder
        if previous is None:
            os.environ.pop("KVPOLICY_CACHE_DIR", None)
        else:
            os.environ["KVPOLICY_CACHE_DIR"] = previous


#: Folders whose tests run in one xdist worker each (``make test`` runs ``-n 2 --dist loadgroup``):
#: the transfer tests start processes, namespaces and etcd servers and keep real timeouts, so they
#: run one at a time as they would alone; the report tests share pages within a process.
SERIAL_GROUPS = ("transports", "report")


def pytest_collection_modifyitems(config, items):
    for item in items:
        parts = item.nodeid.split("/")
        if len(parts) > 2 and parts[0] == "tests" and parts[1] in SERIAL_GROUPS:
            item.add_marker(pytest.mark.xdist_group(parts[1]))
