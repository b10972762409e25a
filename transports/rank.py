"""What one side of a control connection tells the other about itself (hello and welcome), and the
checks of it: every number bounded, so that nothing behind it can overflow an address or a count."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from .layout import KVLayout

MAX_METADATA = 1 << 20
"""Largest NIXL agent metadata accepted in a hello or welcome (a UCX agent's is a few KiB)."""
MAX_NAME = 256
"""Longest transceiver name, agent name, request id."""
MAX_POOL_BLOCKS = 1 << 24
"""Largest pool a peer may declare; a sender may lower it (``max_peer_blocks``)."""
_MAX_LAYOUT_FIELD = 1 << 16
_ADDRESS_SPACE = 1 << 64


class ControlMessageError(ValueError):
    """A control frame that does not match the schema. It is dropped and counted, never acted on."""


@dataclass(frozen=True)
class RankInfo:
    """What one side tells the other about itself when they connect."""

    name: str
    """Transceiver name, for logs."""
    agent: str
    """NIXL agent name."""
    metadata: bytes
    """NIXL agent metadata (empty unless the peer will write to this side, or read from it)."""
    layout: KVLayout
    base_address: int
    num_blocks: int
    memory_type: str
    device_id: int

    def to_wire(self) -> dict[str, Any]:
        data = asdict(self)
        data["layout"] = self.layout.to_wire()
        return data

    @classmethod
    def from_wire(cls, data: Any) -> RankInfo:
        _check_fields("rank", data, _RANK_FIELDS)
        try:
            layout = KVLayout.from_wire(data["layout"])
        except ValueError as exc:
            raise ControlMessageError(f"rank.layout: {exc}") from None
        for key, value in data["layout"].items():
            if isinstance(value, int) and not 0 <= value < _MAX_LAYOUT_FIELD:
                raise ControlMessageError(f"rank.layout.{key} {value} out of range")
        if data["memory_type"] not in ("DRAM", "VRAM"):
            raise ControlMessageError(f"rank.memory_type {data['memory_type']!r} is not DRAM or VRAM")
        check_text("rank.name", data["name"])
        check_text("rank.agent", data["agent"])
        if len(data["metadata"]) > MAX_METADATA:
            raise ControlMessageError(f"rank.metadata: {len(data['metadata'])} bytes, more than {MAX_METADATA}")
        if not 0 < data["num_blocks"] <= MAX_POOL_BLOCKS:
            raise ControlMessageError(f"rank.num_blocks {data['num_blocks']} not in 1..{MAX_POOL_BLOCKS}")
        if not 0 <= data["device_id"] < _MAX_LAYOUT_FIELD:
            raise ControlMessageError(f"rank.device_id {data['device_id']} out of range")
        end = data["base_address"] + data["num_blocks"] * layout.block_bytes
        if data["base_address"] <= 0 or end > _ADDRESS_SPACE:
            raise ControlMessageError("rank: the pool [base_address, + num_blocks * block_bytes) is not in the address space")
        return cls(**{**data, "layout": layout})


_RANK_FIELDS: dict[str, type | tuple[type, ...]] = {
    "name": str,
    "agent": str,
    "metadata": bytes,
    "layout": dict,
    "base_address": int,
    "num_blocks": int,
    "memory_type": str,
    "device_id": int,
}


def _check_fields(where: str, data: Any, schema: dict[str, type | tuple[type, ...]]) -> None:
    if not isinstance(data, dict):
        raise ControlMessageError(f"{where}: expected a map, got {type(data).__name__}")
    if set(data) != set(schema):
        missing = sorted(set(schema) - set(data))
        extra = sorted(map(str, set(data) - set(schema)))
        raise ControlMessageError(f"{where}: missing fields {missing}, unexpected fields {extra}")
    for key, expected in schema.items():
        value = data[key]
        # bool is an int subclass; a boolean where a count belongs is a foreign or broken sender.
        if isinstance(value, bool) or not isinstance(value, expected):
            raise ControlMessageError(f"{where}.{key}: expected {expected}, got {type(value).__name__}")


def check_text(where: str, value: str, limit: int = MAX_NAME) -> None:
    """Refuse an empty name or text longer than ``limit`` (:class:`ControlMessageError`)."""
    if not value or len(value) > limit:
        raise ControlMessageError(f"{where}: empty or longer than {limit} characters")
