"""Creating NIXL agents with the settings that work on these machines.

The defaults come from measurements (docs ``nixl-notes.md``); each is overridable through
:class:`NixlSettings` and, for the UCX ones, by setting the environment variable before the first
agent is created (an explicit environment value always wins over a default).
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Any

log = logging.getLogger("kvpolicy.transports")


@dataclass(frozen=True)
class NixlSettings:
    """How a transceiver creates its NIXL agent.

    ``progress_delay_us``: the longest the agent's progress thread sleeps when nothing happens. The
    thread waits in ``poll()`` on the UCX workers' event fds with this as its timeout, so events wake
    it at once and the delay only bounds how often an idle agent wakes up. NIXL's Python API uses 0,
    which busy-spins a core per agent; 1 ms (the previous default) still woke every agent ~1,000
    times a second (1.5% of a core idle); 1 s makes an idle transceiver cost ~0.01% with the same
    request latency (bench/transfer.py, same run).

    ``ucx_env``: UCX variables applied with ``os.environ.setdefault`` before the first agent of the
    process is created. ``UCX_NET_DEVICES=lo`` keeps traffic on loopback; ``UCX_MODULES=^ib`` avoids a
    segfault at process exit in the bundled netlink library; ``UCX_CMA_SEG_SIZE=8M`` lets one CMA call
    move 8 MiB. Pass a different mapping (or set the variables yourself) to change them; set
    ``UCX_NET_DEVICES`` to the real NIC on a multi-node deployment.
    """

    progress_delay_us: int = 1_000_000
    ucx_env: tuple[tuple[str, str], ...] = (
        ("UCX_NET_DEVICES", "lo"),
        ("UCX_MODULES", "^ib"),
        ("UCX_CMA_SEG_SIZE", "8M"),
    )
    backends: tuple[str, ...] = ("UCX",)

    def apply_environment(self) -> None:
        """Set the UCX variables that are not already set in this process."""
        for key, value in self.ucx_env:
            os.environ.setdefault(key, value)


def import_nixl(settings: NixlSettings | None = None) -> Any:
    """Import ``nixl._api`` after applying the UCX environment (UCX reads it when it loads)."""
    (settings or NixlSettings()).apply_environment()
    import nixl._api as nixl_api

    return nixl_api


def nixl_version() -> str:
    """The installed NIXL release (its distribution's version: ``nixl``, or the ``nixl-cu12`` /
    ``nixl-cu13`` wheel it installs); :class:`RuntimeError` when none is installed as a package."""
    from importlib import metadata

    for distribution in ("nixl", "nixl-cu13", "nixl-cu12"):
        try:
            return metadata.version(distribution)
        except metadata.PackageNotFoundError:
            continue
    raise RuntimeError("NIXL is not installed as a package (pip install nixl): its release decides which metadata format kvpolicy reads")


def nixl_available() -> tuple[bool, str]:
    """Whether NIXL can load here, and why not if it cannot."""
    try:
        import_nixl()
    except Exception as exc:  # ImportError, or OSError from a bundled library
        return False, f"{type(exc).__name__}: {exc}"
    return True, ""


def create_agent(name: str, settings: NixlSettings) -> Any:
    """Create a ``nixl_agent`` whose progress thread polls every ``settings.progress_delay_us``.

    ``nixl_agent`` hard-codes a progress delay of 0. The delay is read when a backend is created, so
    the agent is made without backends, its core is replaced by one built from our own
    ``nixlAgentConfig``, and only then is UCX created.
    """
    nixl_api = import_nixl(settings)
    bindings = nixl_api.nixlBind
    agent = nixl_api.nixl_agent(name, nixl_api.nixl_agent_config(backends=[]))
    config = bindings.nixlAgentConfig()
    config.useProgThread = True
    config.useListenThread = False
    config.syncMode = bindings.NIXL_THREAD_SYNC_NONE
    config.pthrDelay = settings.progress_delay_us
    agent.agent = bindings.nixlAgent(name, config)
    for backend in settings.backends:
        if backend not in agent.plugin_list:
            raise RuntimeError(f"NIXL backend plugin {backend!r} is not available (have {agent.plugin_list})")
        agent.create_backend(backend, {})
    return agent
