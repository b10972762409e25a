"""The declared shape of a KV block pool, and which part of the model a pool holds.

A pool is *block-major*: the bytes of one block (all its layers, K and V, all its heads) are adjacent.
Within a block the order is ``[layer][k/v][kv head][token][head dim]``. Block-major keeps a whole block
one descriptor when both sides hold the same layers and heads, which is what lets scattered blocks move
at close to the contiguous rate; heads come before tokens so that a tensor-parallel head slice of one
layer is still one contiguous run.
"""

from __future__ import annotations

import functools

from dataclasses import dataclass
from typing import Any

#: Element sizes of the dtypes a pool may hold, by name. Names follow torch (``torch.bfloat16`` ->
#: ``"bfloat16"``) so that a layout can travel in a control message without importing torch.
DTYPE_SIZES: dict[str, int] = {
    "float32": 4,
    "float16": 2,
    "bfloat16": 2,
    "float8_e4m3fn": 1,
    "float8_e5m2": 1,
    "int8": 1,
    "uint8": 1,
}


def dtype_name(dtype: Any) -> str:
    """Return the canonical name of ``dtype`` (a torch dtype or a name such as ``"bf16"``)."""
    name = str(dtype).removeprefix("torch.")
    name = {"bf16": "bfloat16", "fp16": "float16", "half": "float16", "fp32": "float32", "float": "float32"}.get(name, name)
    if name not in DTYPE_SIZES:
        raise ValueError(f"unsupported KV dtype {dtype!r}; expected one of {sorted(DTYPE_SIZES)}")
    return name


@dataclass(frozen=True)
class KVLayout:
    """Shape of one rank's KV blocks and the slice of the model's layers and heads they hold.

    ``num_layers`` / ``kv_heads`` are what *this* pool holds; ``first_layer`` / ``first_head`` place
    that slice in the whole model, so that two ranks with different pipeline- or tensor-parallel sizes
    can compute which of their bytes overlap (see :func:`kvpolicy.transports.map_ranks`).
    """

    num_layers: int
    kv_heads: int
    tokens_per_block: int
    head_dim: int
    dtype: str = "bfloat16"
    first_layer: int = 0
    first_head: int = 0

    def __post_init__(self) -> None:
        object.__setattr__(self, "dtype", dtype_name(self.dtype))
        for field in ("num_layers", "kv_heads", "tokens_per_block", "head_dim"):
            value = getattr(self, field)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"KVLayout.{field} must be a positive int, got {value!r}")
        for field in ("first_layer", "first_head"):
            value = getattr(self, field)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ValueError(f"KVLayout.{field} must be a non-negative int, got {value!r}")

    # -- sizes -------------------------------------------------------------------------------------

    @property
    def itemsize(self) -> int:
        """Bytes per element."""
        return DTYPE_SIZES[self.dtype]

    @property
    def head_bytes(self) -> int:
        """Bytes of one kv head of one layer, K or V, in one block."""
        return self.tokens_per_block * self.head_dim * self.itemsize

    @property
    def kv_bytes(self) -> int:
        """Bytes of all heads of K (or of V) for one layer of one block."""
        return self.kv_heads * self.head_bytes

    @property
    def layer_bytes(self) -> int:
        """Bytes of one layer (K and V) of one block."""
        return 2 * self.kv_bytes

    @functools.cached_property
    def block_bytes(self) -> int:
        """Bytes of one block: all layers, K and V, all heads held here (kept: every write asks)."""
        return self.num_layers * self.layer_bytes

    @property
    def block_shape(self) -> tuple[int, int, int, int, int]:
        """Tensor shape of one block: ``(layers, 2, kv_heads, tokens_per_block, head_dim)``."""
        return (self.num_layers, 2, self.kv_heads, self.tokens_per_block, self.head_dim)

    @property
    def layers(self) -> range:
        """The model layers this pool holds."""
        return range(self.first_layer, self.first_layer + self.num_layers)

    @property
    def heads(self) -> range:
        """The model kv heads this pool holds."""
        return range(self.first_head, self.first_head + self.kv_heads)

    # -- sharding ----------------------------------------------------------------------------------

    def shard(self, *, tp_size: int = 1, tp_rank: int = 0, pp_size: int = 1, pp_rank: int = 0) -> KVLayout:
        """Return the layout of one rank when this (whole-model) layout is split TP x PP ways.

        Heads are split evenly over ``tp_size`` ranks, layers evenly over ``pp_size`` stages.
        """
        if not (0 <= tp_rank < tp_size) or not (0 <= pp_rank < pp_size):
            raise ValueError(f"rank out of range: tp {tp_rank}/{tp_size}, pp {pp_rank}/{pp_size}")
        if self.kv_heads % tp_size:
            raise ValueError(f"{self.kv_heads} kv heads cannot be split evenly over tp_size={tp_size}")
        if self.num_layers % pp_size:
            raise ValueError(f"{self.num_layers} layers cannot be split evenly over pp_size={pp_size}")
        heads = self.kv_heads // tp_size
        layers = self.num_layers // pp_size
        return KVLayout(
            num_layers=layers,
            kv_heads=heads,
            tokens_per_block=self.tokens_per_block,
            head_dim=self.head_dim,
            dtype=self.dtype,
            first_layer=self.first_layer + pp_rank * layers,
            first_head=self.first_head + tp_rank * heads,
        )

    # -- wire form ---------------------------------------------------------------------------------

    def to_wire(self) -> dict[str, Any]:
        """Plain-data form for control messages."""
        return {
            "num_layers": self.num_layers,
            "kv_heads": self.kv_heads,
            "tokens_per_block": self.tokens_per_block,
            "head_dim": self.head_dim,
            "dtype": self.dtype,
            "first_layer": self.first_layer,
            "first_head": self.first_head,
        }

    @classmethod
    def from_wire(cls, data: Any) -> KVLayout:
        """Rebuild a layout from :meth:`to_wire` output; raises ``ValueError`` on anything else."""
        if not isinstance(data, dict):
            raise ValueError(f"layout must be a map, got {type(data).__name__}")
        expected = set(cls.__dataclass_fields__)
        if set(data) != expected:
            raise ValueError(f"layout fields {sorted(map(str, data))} != {sorted(expected)}")
        try:
            return cls(**data)
        except TypeError as exc:
            raise ValueError(str(exc)) from None
