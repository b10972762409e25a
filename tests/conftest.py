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
