"""An offer: the blocks a sender offered for one request id, and what became of them.

Kept apart from :mod:`.sender`, which serves offers, so that :mod:`.reads` (which announces them)
depends on the offer and not on the sender.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .peers import Remote
from .request import TransferHandle

__all__ = ["Offer"]


@dataclass(slots=True)
class Offer:
    """Blocks offered for one request id."""

    handle: TransferHandle
    receivers: int
    to: frozenset[bytes] | None
    """Keys of the receivers it is for; None: any allowed peer."""
    served: int = 0
    cancelled: int = 0
    failed: str = ""
    writes: int = 0
    cancel_requested: bool = False
    served_by: set[bytes] = field(default_factory=set)
    timer: Any = None
    token: int = 0  # (reads) this offer's announcements, the receivers that owe a release, withdrawn?
    announced: dict[bytes, Remote] = field(default_factory=dict)
    withdrawn: bool = False

    def for_key(self, key: bytes) -> bool:
        return self.to is None or key in self.to
