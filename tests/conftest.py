"""Settings for the whole suite."""

from __future__ import annotations

import os
import tempfile

import pytest
from hypothesis import settings

import kvpolicy
from kvpolicy.read.loader import shipped_root
from tests.support.constants import NEWEST_AUTO, VERSIONS

#: Hypothesis profiles. ``gate`` (the default, what ``make test`` and CI run) is derandomised: every
#: property test draws the same examples on every machine for the same commit, and no example
#: database carries draws from one run into the next, so a red run is a red commit, reproducible by
#: running the test again. ``random`` draws fresh examples (the seed is printed in pytest's header
#: and in every failure's ``--hypothesis-seed`` line) and keeps failures in .hypothesis/ to replay;
#: ``make fuzz-properties`` runs it in a loop, outside the gate. Select with KVPOLICY_HYPOTHESIS.
settings.register_profile("gate", derandomize=True, database=None, print_blob=True)
settings.register_profile("random", derandomize=False, print_blob=True)
PROFILE = os.environ.get("KVPOLICY_HYPOTHESIS", "gate")
settings.load_profile(PROFILE)


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


#: Folders whose tests run in one xdist worker each (``make test`` runs ``-n 2 --dist loadgroup``),
#: by folder: the transfer tests start processes, namespaces and etcd servers and keep real
#: timeouts, so they run one at a time as they would alone, and the demo's end-to-end run (NIXL
#: worker processes) runs among them; the report tests share pages within a process.
SERIAL_GROUPS = {"transports": "transports", "demo": "transports", "report": "report"}


def pytest_collection_modifyitems(config, items):
    for item in items:
        parts = item.nodeid.split("/")
        if len(parts) > 2 and parts[0] == "tests" and parts[1] in SERIAL_GROUPS:
            item.add_marker(pytest.mark.xdist_group(SERIAL_GROUPS[parts[1]]))


# -- the shipped policies, for every suite --------------------------------------------------------


@pytest.fixture(scope="session")
def shipped() -> dict[str, kvpolicy.PolicySet]:
    """Every shipped policy version, loaded once."""
    return {v: kvpolicy.load(version=v) for v in VERSIONS}


@pytest.fixture(scope="session")
def newest(shipped: dict[str, kvpolicy.PolicySet]) -> kvpolicy.PolicySet:
    """The newest version whose left-out fields request auto (:data:`NEWEST_AUTO`)."""
    return shipped[NEWEST_AUTO]


@pytest.fixture
def policy_text() -> str:
    """The text of :data:`NEWEST_AUTO`, for tests that edit a copy."""
    return (shipped_root() / f"{NEWEST_AUTO}.toml").read_text(encoding="utf-8")
