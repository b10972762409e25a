"""The KV-cache transfer layer that resolutions feed.

``open_transceiver(resolution, pool)`` opens the transceiver for the decided runtime and backend. The
PYTHON runtime over NIXL is implemented here (:class:`NixlTransceiver`); other runtimes plug in through
the entry-point group ``kvpolicy.transceivers``. Ranks on different hosts find each other through
etcd with :class:`EtcdRegistry`. Importing this package imports torch lazily (on the first
:class:`BlockPool`) and NIXL only when a transceiver starts.
"""

from .agent import NixlSettings, nixl_available
from .control import ControlMessageError
from .keys import AllowList, Identity, KeyMaterialError, create_keys
from .discovery import EtcdRegistry, RankRecord, RankWatch, Registration, RegistryError, RegistryUnavailable
from .etcd_client import EtcdSecurity, RegistryDenied
from .layout import KVLayout
from .mapping import DescriptorPlan, Overlap, RankMapping, block_segments, map_ranks, overlap, plan_descriptors
from .pool import BlockPool
from .request import RequestState, TransferError, TransferHandle, TransferMetrics
from .selection import (
    ENTRY_POINT_GROUP,
    Transceiver,
    TransceiverSelectionError,
    find_transceiver,
    open_transceiver,
    timeout_from,
)


def __getattr__(name: str) -> object:
    # The NIXL transceiver imports zmq at module level; keep it out of plain `import kvpolicy.transports`.
    if name in ("NixlTransceiver", "Peer", "Limits"):
        from . import transceiver

        return getattr(transceiver, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "EtcdSecurity",
    "RankRecord",
    "RegistryDenied",
    "AllowList",
    "Identity",
    "KeyMaterialError",
    "Limits",
    "create_keys",
    "BlockPool",
    "ControlMessageError",
    "DescriptorPlan",
    "ENTRY_POINT_GROUP",
    "EtcdRegistry",
    "KVLayout",
    "NixlSettings",
    "NixlTransceiver",
    "Overlap",
    "Peer",
    "RankMapping",
    "RankWatch",
    "Registration",
    "RegistryError",
    "RegistryUnavailable",
    "RequestState",
    "Transceiver",
    "TransceiverSelectionError",
    "TransferError",
    "TransferHandle",
    "TransferMetrics",
    "block_segments",
    "find_transceiver",
    "map_ranks",
    "nixl_available",
    "open_transceiver",
    "overlap",
    "plan_descriptors",
    "timeout_from",
]
