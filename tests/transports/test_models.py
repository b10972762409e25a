"""Prompt KV cache <-> block pool, in one process: the decode side rebuilds exactly what prefill had."""

from __future__ import annotations

import random

import pytest

from kvpolicy.transports import BlockPool

transformers = pytest.importorskip("transformers", reason="the end-to-end models need kvpolicy[demo] (transformers)")

from kvpolicy.demo.models import (  # noqa: E402  (after the importorskip: it imports transformers)
    ARCHITECTURES,
    ModelSpec,
    blocks_for,
    build_model,
    cache_from_blocks,
    continue_greedy,
    layer_windows,
    layers_needing,
    layout_for,
    prefill,
    reference_generation,
    weights_digest,
    write_cache,
)


@pytest.mark.parametrize("architecture", ARCHITECTURES)
def test_cache_through_scattered_pool_blocks_reproduces_generate(architecture):
    model, config = build_model(ModelSpec(architecture, "tiny", seed=3))
    prompt = [random.Random(1).randrange(config.vocab_size) for _ in range(19)]
    reference = reference_generation(model, prompt, 6)
    cache, first, logprob = prefill(model, prompt)
    pool = BlockPool(layout_for(config, tokens_per_block=4), 12, huge_pages=False)
    blocks = [7, 1, 10, 3, 5]  # scattered on purpose
    assert len(blocks) == blocks_for(len(prompt), 4)
    write_cache(pool, blocks, cache, len(prompt), layer_windows(config))
    rebuilt = cache_from_blocks(pool, blocks, config, len(prompt))
    generation = continue_greedy(model, rebuilt, len(prompt), first, logprob, 6)
    assert generation.tokens == reference.tokens
    assert max(abs(a - b) for a, b in zip(generation.logprobs, reference.logprobs)) <= 1e-5


def test_a_corrupted_block_changes_the_answer():
    # The equality above is only meaningful if the decode side really reads the pool.
    model, config = build_model(ModelSpec("LlamaForCausalLM", "tiny", seed=3))
    prompt = [random.Random(2).randrange(config.vocab_size) for _ in range(16)]
    reference = reference_generation(model, prompt, 4)
    cache, first, logprob = prefill(model, prompt)
    pool = BlockPool(layout_for(config, 4), 4, huge_pages=False)
    write_cache(pool, [0, 1, 2, 3], cache, 16, layer_windows(config))
    pool.tensor[2].mul_(-3.0)
    generation = continue_greedy(model, cache_from_blocks(pool, [0, 1, 2, 3], config, 16), 16, first, logprob, 4)
    assert max(abs(a - b) for a, b in zip(generation.logprobs, reference.logprobs)) > 1e-3


def test_gemma3_sliding_layers_keep_a_shorter_cache():
    model, config = build_model(ModelSpec("Gemma3ForCausalLM", "tiny", seed=0, sliding_window=8))
    windows = layer_windows(config)
    assert windows == (7, None, 7, None)
    cache, _, _ = prefill(model, list(range(1, 22)))
    assert [layer.keys.shape[2] for layer in cache.layers] == [7, 21, 7, 21]
    # Block 0 (positions 0-3) serves only the full layers; the last block serves all of them.
    assert layers_needing(0, 21, 4, windows) == frozenset({1, 3})
    assert layers_needing(5, 21, 4, windows) == frozenset({0, 1, 2, 3})


def test_same_seed_same_weights_other_seed_other_weights():
    a, _ = build_model(ModelSpec("MistralForCausalLM", "tiny", seed=5))
    b, _ = build_model(ModelSpec("MistralForCausalLM", "tiny", seed=5))
    c, _ = build_model(ModelSpec("MistralForCausalLM", "tiny", seed=6))
    assert weights_digest(a) == weights_digest(b) != weights_digest(c)


def test_config_names_its_architecture():
    _, config = build_model(ModelSpec("Gemma3ForCausalLM", "tiny"))
    assert config.architectures == ["Gemma3ForCausalLM"]
    with pytest.raises(ValueError, match="the demo builds"):
        build_model(ModelSpec("GPT2LMHeadModel"))
