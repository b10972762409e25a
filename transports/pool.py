"""A KV block pool: one tensor, a declared layout, block ids -> memory regions."""

from __future__ import annotations

import hashlib
import operator
import mmap
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

from .layout import KVLayout

if TYPE_CHECKING:
    import torch

_HUGE_PAGE = 2 << 20
_INT_ONLY = frozenset((int,))


def _torch() -> Any:
    import torch

    return torch


class BlockPool:
    """``num_blocks`` KV blocks of one :class:`KVLayout` in a single torch tensor.

    The tensor has shape ``(num_blocks, layers, 2, kv_heads, tokens_per_block, head_dim)`` and is
    block-major (see :mod:`kvpolicy.transports.layout`). One tensor means one NIXL registration per
    pool, made once when a transceiver starts, and block ``i`` is the byte range
    ``[base + i * block_bytes, base + (i + 1) * block_bytes)``.

    On CPU the pool is backed by anonymous memory advised for transparent huge pages by default: NIXL
    over UCX's CMA transport pins the remote pages on every call, and 2 MiB pages make that 512x
    cheaper (it roughly doubles throughput here). Pass ``huge_pages=False`` to use torch's allocator.
    """

    def __init__(
        self,
        layout: KVLayout,
        num_blocks: int,
        *,
        device: str | torch.device = "cpu",
        huge_pages: bool = True,
        tensor: torch.Tensor | None = None,
    ) -> None:
        torch = _torch()
        if not isinstance(num_blocks, int) or isinstance(num_blocks, bool) or num_blocks <= 0:
            raise ValueError(f"num_blocks must be a positive int, got {num_blocks!r}")
        self.layout = layout
        self.num_blocks = num_blocks
        shape = (num_blocks, *layout.block_shape)
        dtype = getattr(torch, layout.dtype)
        if tensor is not None:
            if tuple(tensor.shape) != shape or tensor.dtype != dtype or not tensor.is_contiguous():
                raise ValueError(f"pool tensor must be contiguous {layout.dtype} of shape {shape}, got {tensor.dtype} {tuple(tensor.shape)}")
            self.tensor = tensor
        else:
            where = torch.device(device)
            if where.type == "cpu" and huge_pages:
                self.tensor = self._huge_page_tensor(shape, dtype)
            else:
                self.tensor = torch.zeros(shape, dtype=dtype, device=where)

    @staticmethod
    def _huge_page_tensor(shape: tuple[int, ...], dtype: Any) -> torch.Tensor:
        torch = _torch()
        nbytes = 1
        for dim in shape:
            nbytes *= dim
        nbytes *= torch.empty((), dtype=dtype).element_size()
        # Private anonymous memory: a shared mapping would be shmem, whose huge pages follow a
        # different (usually disabled) knob. The extra 2 MiB lets the tensor start on a page boundary.
        region = mmap.mmap(-1, nbytes + _HUGE_PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        if hasattr(mmap, "MADV_HUGEPAGE"):
            region.madvise(mmap.MADV_HUGEPAGE)
        raw = torch.frombuffer(region, dtype=torch.uint8)  # keeps `region` alive
        skip = (-raw.data_ptr()) % _HUGE_PAGE
        tensor = raw[skip : skip + nbytes].view(dtype).view(shape)
        # Fault the pages in now: otherwise the first transfer into the pool pays for it.
        tensor.view(torch.uint8).zero_()
        return tensor

    # -- memory ------------------------------------------------------------------------------------

    @property
    def device(self) -> torch.device:
        """Where the pool lives."""
        return self.tensor.device

    @property
    def memory_type(self) -> str:
        """NIXL memory type of the pool: ``"DRAM"`` or ``"VRAM"``."""
        return "VRAM" if self.tensor.device.type == "cuda" else "DRAM"

    @property
    def device_id(self) -> int:
        """NIXL device id: the CUDA device index, 0 for host memory."""
        if self.tensor.device.type == "cuda":
            return self.tensor.device.index or 0
        return 0

    @property
    def base_address(self) -> int:
        """Address of block 0."""
        return int(self.tensor.data_ptr())

    @property
    def block_bytes(self) -> int:
        """Bytes per block."""
        return self.layout.block_bytes

    @property
    def nbytes(self) -> int:
        """Bytes of the whole pool."""
        return self.num_blocks * self.layout.block_bytes

    def region(self, block_id: int) -> tuple[int, int]:
        """``(address, length)`` of one block."""
        self.check_blocks([block_id])
        return self.base_address + block_id * self.block_bytes, self.block_bytes

    def check_blocks(self, block_ids: Iterable[int]) -> list[int]:
        """Return ``block_ids`` as a list of ints, or raise ``ValueError`` naming the bad ones.

        Integers only (numpy's too): a float or a string is refused, not truncated or parsed."""
        ids = list(block_ids)
        if not _INT_ONLY.issuperset(map(type, ids)):  # in C: no Python frame per block
            wrong = [b for b in ids if isinstance(b, bool) or not hasattr(b, "__index__")]
            if wrong:
                raise ValueError(f"block ids must be ints, got {wrong[:8]!r}")
            ids = [operator.index(b) for b in ids]
        if ids and (min(ids) < 0 or max(ids) >= self.num_blocks):
            bad = [b for b in ids if not 0 <= b < self.num_blocks]
            raise ValueError(f"block ids {bad[:8]} out of range for a pool of {self.num_blocks} blocks")
        if len(ids) > 1 and len(set(ids)) != len(ids):
            raise ValueError("block ids must be distinct")
        return ids

    # -- contents ----------------------------------------------------------------------------------

    def block(self, block_id: int) -> torch.Tensor:
        """View of one block, shape :attr:`KVLayout.block_shape`."""
        return self.tensor[block_id]

    def digest(self, block_id: int) -> str:
        """A hash of one block's bytes, for checking that a transfer was bit-identical."""
        data = self.tensor[block_id].detach().contiguous().view(_torch().uint8).cpu().numpy()
        return hashlib.blake2b(memoryview(data), digest_size=16).hexdigest()  # type: ignore[arg-type]  # numpy types ndarray as a buffer on Python >= 3.12 only

    def digests(self, block_ids: Sequence[int]) -> list[str]:
        """:meth:`digest` of each block."""
        return [self.digest(b) for b in block_ids]

    def __repr__(self) -> str:
        return f"BlockPool({self.num_blocks} x {self.block_bytes} B on {self.device}, {self.layout})"
