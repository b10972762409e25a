"""Real Hugging Face models on both sides of a disaggregated run: prompt KV cache <-> block pool.

The prefill side runs a prompt, keeps the first generated token, and writes the prompt's KV cache
into its block pool; the decode side rebuilds a ``DynamicCache`` from the blocks it received and
continues greedily. Blocks are indexed by absolute token position: block ``i`` of a request holds
positions ``[i * tokens_per_block, (i + 1) * tokens_per_block)`` of every layer. Sliding-window
layers (Gemma3's local layers) keep only their last ``window - 1`` positions, so only the blocks in
that window carry their K/V; full-attention layers use every block. :func:`layers_needing` says which
layers a block must hold, which is what prefix reuse on the decode side checks.

Models are built from fixed seeds with random weights (no download): both processes build the same
weights from the same seed, and :func:`weights_digest` proves it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

import torch

from ..transports.layout import KVLayout
from ..transports.pool import BlockPool

if TYPE_CHECKING:
    import transformers
    from transformers.cache_utils import CacheLayerMixin

__all__ = [
    "ARCHITECTURES",
    "Generation",
    "ModelSpec",
    "blocks_for",
    "build_model",
    "cache_from_blocks",
    "continue_greedy",
    "layer_windows",
    "layers_needing",
    "layout_for",
    "prefill",
    "reference_generation",
    "weights_digest",
    "write_cache",
]

#: The demo's architectures: two with a PYTHON preference (2026.08.11 on) and one without any.
ARCHITECTURES = ("LlamaForCausalLM", "Gemma3ForCausalLM", "MistralForCausalLM")

_SIZES = {
    # hidden, layers, heads, kv heads, head dim, intermediate, vocab
    "tiny": (64, 4, 4, 2, 16, 128, 512),
    "small": (256, 8, 8, 4, 32, 512, 2048),
    "medium": (1024, 16, 16, 8, 64, 2048, 8192),
}


@dataclass(frozen=True)
class ModelSpec:
    """Which model to build: architecture, size preset, seed."""

    architecture: str
    size: str = "tiny"
    seed: int = 0
    sliding_window: int = 8


@dataclass(frozen=True)
class Generation:
    """Greedy tokens and the log-probability of each."""

    tokens: tuple[int, ...]
    logprobs: tuple[float, ...]


def build_model(spec: ModelSpec) -> tuple[Any, Any]:
    """Build a randomly initialised model and its config (``architectures`` set as a checkpoint's is)."""
    import transformers

    if spec.size not in _SIZES:
        raise ValueError(f"unknown model size {spec.size!r}; choose one of {', '.join(_SIZES)}")
    hidden, layers, heads, kv_heads, head_dim, intermediate, vocab = _SIZES[spec.size]
    common: dict[str, Any] = dict(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=intermediate,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        head_dim=head_dim,
        max_position_embeddings=4096,
        # A wide initialisation makes greedy choices decisive, so token equality is a sharp check.
        initializer_range=0.2,
    )
    config: transformers.PretrainedConfig
    cls: type[transformers.PreTrainedModel]
    if spec.architecture == "LlamaForCausalLM":
        config = transformers.LlamaConfig(**common)
        cls = transformers.LlamaForCausalLM
    elif spec.architecture == "MistralForCausalLM":
        config = transformers.MistralConfig(**common, sliding_window=None)
        cls = transformers.MistralForCausalLM
    elif spec.architecture == "Gemma3ForCausalLM":
        kinds = ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(layers)]
        config = transformers.Gemma3TextConfig(**common, sliding_window=spec.sliding_window, layer_types=kinds)
        cls = transformers.Gemma3ForCausalLM
    else:
        raise ValueError(f"the demo builds {', '.join(ARCHITECTURES)}, not {spec.architecture!r}")
    config.architectures = [spec.architecture]
    torch.manual_seed(spec.seed)
    model = cls(config).eval()  # type: ignore[arg-type]  # each branch above pairs a model class with its own config class
    # No end-of-sequence token: every run generates exactly the tokens asked for, unprocessed.
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    return model, config


def weights_digest(model: Any) -> str:
    """sha256 over every parameter, in name order: equal on both sides or the check is meaningless."""
    digest = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        digest.update(name.encode())
        digest.update(tensor.detach().contiguous().view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def layer_windows(config: Any) -> tuple[int | None, ...]:
    """Per layer, how many past positions its cache keeps (``None``: all of them)."""
    kinds = getattr(config, "layer_types", None) or ["full_attention"] * config.num_hidden_layers
    window = getattr(config, "sliding_window", None)
    return tuple((window - 1) if kind == "sliding_attention" and window else None for kind in kinds)


def layout_for(config: Any, tokens_per_block: int, dtype: str = "float32") -> KVLayout:
    """The block layout that holds this model's KV cache."""
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    return KVLayout(
        num_layers=config.num_hidden_layers,
        kv_heads=config.num_key_value_heads,
        tokens_per_block=tokens_per_block,
        head_dim=head_dim,
        dtype=dtype,
    )


def blocks_for(prompt_len: int, tokens_per_block: int) -> int:
    """How many blocks a prompt of ``prompt_len`` tokens spans."""
    return -(-prompt_len // tokens_per_block)


def layers_needing(index: int, prompt_len: int, tokens_per_block: int, windows: Sequence[int | None]) -> frozenset[int]:
    """The layers whose cache uses block ``index`` of a ``prompt_len``-token prompt."""
    start, end = index * tokens_per_block, min((index + 1) * tokens_per_block, prompt_len)
    needed = set()
    for layer, window in enumerate(windows):
        first = 0 if window is None else max(0, prompt_len - window)
        if end > first and start < prompt_len:
            needed.add(layer)
    return frozenset(needed)


def prefill(model: Any, prompt: Sequence[int]) -> tuple[Any, int, float]:
    """Run the prompt; return its KV cache, the first greedy token and that token's log-probability."""
    ids = torch.tensor([list(prompt)], device=model.device)
    with torch.no_grad():
        out = model(ids, use_cache=True)
    logprobs = torch.log_softmax(out.logits[0, -1].float(), -1)
    token = int(logprobs.argmax())
    return _cache_of(out), token, float(logprobs[token])


def write_cache(pool: BlockPool, block_ids: Sequence[int], cache: Any, prompt_len: int, windows: Sequence[int | None]) -> None:
    """Write a prompt's KV cache into pool blocks (``block_ids[i]`` holds positions of block ``i``)."""
    tpb = pool.layout.tokens_per_block
    if len(block_ids) != blocks_for(prompt_len, tpb):
        raise ValueError(f"{prompt_len} tokens need {blocks_for(prompt_len, tpb)} blocks, got {len(block_ids)}")
    blocks = pool.tensor
    for layer, (cached, window) in enumerate(zip(cache.layers, windows)):
        keys, values = cached.keys[0], cached.values[0]  # (kv_heads, positions, head_dim)
        first = 0 if window is None else max(0, prompt_len - window)
        if keys.shape[1] != prompt_len - first:
            raise ValueError(f"layer {layer} holds {keys.shape[1]} positions, expected {prompt_len - first}")
        for index, block in enumerate(block_ids):
            start, end = max(index * tpb, first), min((index + 1) * tpb, prompt_len)
            if start >= end:
                continue
            blocks[block, layer, 0, :, start - index * tpb : end - index * tpb] = keys[:, start - first : end - first]
            blocks[block, layer, 1, :, start - index * tpb : end - index * tpb] = values[:, start - first : end - first]


def cache_from_blocks(pool: BlockPool, block_ids: Sequence[int], config: Any, prompt_len: int) -> Any:
    """Rebuild a ``DynamicCache`` for a ``prompt_len``-token prompt from pool blocks."""
    from transformers import DynamicCache

    tpb = pool.layout.tokens_per_block
    windows = layer_windows(config)
    blocks = pool.tensor[list(block_ids)]  # (n, layers, 2, heads, tpb, dim), a copy
    n = len(block_ids)
    # (layers, 2, heads, n * tpb, dim): positions in order
    flat = blocks.permute(1, 2, 3, 0, 4, 5).reshape(pool.layout.num_layers, 2, pool.layout.kv_heads, n * tpb, pool.layout.head_dim)
    cache = DynamicCache(config=config)
    # Attention layers only (full or sliding window), for the architectures the demo builds.
    layers = cast("list[CacheLayerMixin]", cache.layers)
    for layer, (cached, window) in enumerate(zip(layers, windows)):
        first = 0 if window is None else max(0, prompt_len - window)
        keys = flat[layer, 0, :, first:prompt_len].unsqueeze(0).contiguous()
        values = flat[layer, 1, :, first:prompt_len].unsqueeze(0).contiguous()
        cached.lazy_initialization(keys, values)
        cached.keys, cached.values = keys, values
        if hasattr(cached, "cumulative_length"):
            cached.cumulative_length = prompt_len
    return cache


def continue_greedy(model: Any, cache: Any, prompt_len: int, first: int, first_logprob: float, new_tokens: int) -> Generation:
    """Greedy decoding after prefill: ``first`` came from the prefill side; ``new_tokens`` in all."""
    tokens, logprobs = [first], [first_logprob]
    device = model.device
    current = torch.tensor([[first]], device=device)
    with torch.no_grad():
        for step in range(new_tokens - 1):
            position = torch.tensor([prompt_len + step], device=device)
            out = model(current, **{_CACHE_ARG: cache}, use_cache=True, cache_position=position)
            scores = torch.log_softmax(out.logits[0, -1].float(), -1)
            token = int(scores.argmax())
            tokens.append(token)
            logprobs.append(float(scores[token]))
            current = torch.tensor([[token]], device=device)
    return Generation(tuple(tokens), tuple(logprobs))


def _cache_of(output: Any) -> Any:
    # transformers 5.x renamed `past_key_values` to `cache`; accept both.
    cache = output.get("cache") if hasattr(output, "get") else None
    return cache if cache is not None else output.past_key_values


def _cache_argument() -> str:
    import inspect

    from transformers import LlamaForCausalLM

    return "cache" if "cache" in inspect.signature(LlamaForCausalLM.forward).parameters else "past_key_values"


_CACHE_ARG = _cache_argument()


def reference_generation(model: Any, prompt: Sequence[int], new_tokens: int) -> Generation:
    """Single-process ``generate``: the answer a disaggregated run must reproduce."""
    ids = torch.tensor([list(prompt)], device=model.device)
    with torch.no_grad():
        out = model.generate(
            ids,
            max_new_tokens=new_tokens,
            do_sample=False,
            output_scores=True,
            return_dict_in_generate=True,
            pad_token_id=0,
        )
    tokens = out.sequences[0, len(prompt) :].tolist()
    logprobs = [float(torch.log_softmax(s[0].float(), -1)[t]) for s, t in zip(out.scores, tokens)]
    return Generation(tuple(tokens), tuple(logprobs))
