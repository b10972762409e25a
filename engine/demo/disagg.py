"""A disaggregated prefill -> decode run through the runtime a policy chose.

Two worker processes, each with its own model (same seed, same weights), block pool and transceiver:

* the **prefill** worker runs the prompt, keeps the first greedy token, writes the prompt's KV cache
  into its pool and offers the blocks;
* the **decode** worker asks for the blocks it lacks (a prefix it already holds is reused), rebuilds
  the cache from its pool and generates the remaining tokens greedily.

Each worker resolves its own serving config with the policy (as every server does at start-up) and
opens its transceiver with :func:`kvpolicy.transports.open_transceiver`. The parent process only
orchestrates over pipes, with a timeout on every call, and computes the single-process reference.
"""

from __future__ import annotations

import multiprocessing
import os
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..transports.keys import create_keys

__all__ = ["DecodeResult", "RunSettings", "Worker", "run_model"]

_CALL_TIMEOUT_S = 300.0


@dataclass(frozen=True)
class RunSettings:
    """What to run: the policy, the serving config, the model and the request shape."""

    architecture: str
    policy_path: str | None = None
    policy_version: str | None = None
    config: dict[str, Any] = field(default_factory=dict)
    """``cache_transceiver_config`` fields (backend, transceiver_runtime, kv_transfer_timeout_ms, ...)."""
    size: str = "tiny"
    seed: int = 0
    tokens_per_block: int = 4
    num_blocks: int = 128
    device: str = "cpu"


@dataclass(frozen=True)
class DecodeResult:
    """One request on the decode side."""

    request_id: str
    tokens: tuple[int, ...]
    logprobs: tuple[float, ...]
    blocks_total: int
    blocks_received: int
    nbytes: int
    gbps: float
    descriptors: int
    transfer_s: float
    first_decode_token_s: float
    """From the prefill side offering its blocks to the decode side's first decoded token."""


# -- worker side --------------------------------------------------------------------------------


class _Side:
    """State of one worker process: model, pool, transceiver, and (decode) the prefix cache."""

    def __init__(self, role: str, settings: RunSettings, keys_dir: str) -> None:
        import kvpolicy
        from kvpolicy.transports import BlockPool, open_transceiver
        from kvpolicy.demo.models import ModelSpec, build_model, layer_windows, layout_for, weights_digest

        self.role = role
        self.settings = settings
        # Blocks are never returned to the free list: a demo run is a handful of requests.
        self.model, self.config = build_model(ModelSpec(settings.architecture, settings.size, settings.seed))
        if settings.device != "cpu":
            self.model.to(settings.device)
        self.windows = layer_windows(self.config)
        self.digest = weights_digest(self.model)
        # The worker resolves its own config from the model's own `architectures`, like a server.
        policy = kvpolicy.load(settings.policy_path, version=settings.policy_version)
        self.resolution = policy.resolve(settings.config, pretrained_config=self.config)
        self.pool = BlockPool(layout_for(self.config, settings.tokens_per_block), settings.num_blocks, device=settings.device)
        # Each worker has its own key; both keys sit in one directory that both allow (see README, Trust model).
        self.transceiver = open_transceiver(self.resolution, self.pool, name=role, identity=f"{keys_dir}/{role}.key_secret", allowed_peers=keys_dir)
        self.free = list(range(settings.num_blocks))
        self.requests: dict[str, list[int]] = {}
        # decode side: block-token-prefix -> (block id, layers it holds)
        self.prefixes: dict[tuple[int, ...], tuple[int, frozenset[int]]] = {}

    def allocate(self, count: int) -> list[int]:
        if count > len(self.free):
            raise RuntimeError(f"the {self.role} pool is out of blocks ({count} wanted, {len(self.free)} free)")
        taken, self.free = self.free[:count], self.free[count:]
        return taken

    def prefill(self, request_id: str, prompt: Sequence[int]) -> dict[str, Any]:
        from kvpolicy.demo.models import blocks_for, prefill, write_cache

        start = time.perf_counter()
        cache, first, logprob = prefill(self.model, prompt)
        blocks = self.allocate(blocks_for(len(prompt), self.settings.tokens_per_block))
        write_cache(self.pool, blocks, cache, len(prompt), self.windows)
        self.requests[request_id] = blocks
        self.transceiver.send(request_id, blocks, to="decode")
        return {"first": first, "logprob": logprob, "offered_at": time.time(), "prefill_s": time.perf_counter() - start}

    def decode(self, request_id: str, prompt: Sequence[int], first: int, logprob: float, new_tokens: int, offered_at: float) -> DecodeResult:
        from kvpolicy.demo.models import blocks_for, cache_from_blocks, continue_greedy, layers_needing

        tpb = self.settings.tokens_per_block
        total = blocks_for(len(prompt), tpb)
        held: list[int] = []
        for index in range(total):
            end = (index + 1) * tpb
            if end > len(prompt):
                break  # only full blocks are shared
            entry = self.prefixes.get(tuple(prompt[:end]))
            if entry is None or not layers_needing(index, len(prompt), tpb, self.windows) <= entry[1]:
                break
            held.append(entry[0])
        fresh = self.allocate(total - len(held))
        handle = self.transceiver.receive(request_id, fresh, skip_blocks=len(held)) if fresh else None
        metrics = handle.wait() if handle is not None else None
        blocks = held + fresh
        for index, block in enumerate(fresh, start=len(held)):
            end = (index + 1) * tpb
            if end <= len(prompt):  # a full block: later prompts with this prefix may reuse it
                self.prefixes[tuple(prompt[:end])] = (block, layers_needing(index, len(prompt), tpb, self.windows))
        cache = cache_from_blocks(self.pool, blocks, self.config, len(prompt))
        generation, first_decode_at = _continue(self.model, cache, len(prompt), first, logprob, new_tokens, continue_greedy)
        return DecodeResult(
            request_id=request_id,
            tokens=generation.tokens,
            logprobs=generation.logprobs,
            blocks_total=total,
            blocks_received=len(fresh),
            nbytes=metrics.nbytes if metrics else 0,
            gbps=metrics.gbps if metrics else 0.0,
            descriptors=metrics.descriptors if metrics else 0,
            transfer_s=metrics.total_s if metrics else 0.0,
            first_decode_token_s=max(0.0, first_decode_at - offered_at),
        )

    def close(self) -> None:
        self.transceiver.close()


def _continue(model: Any, cache: Any, prompt_len: int, first: int, logprob: float, new_tokens: int, step: Callable[..., Any]) -> tuple[Any, float]:
    """Generate, noting when the first decoded token (the second token overall) exists."""
    if new_tokens <= 1:
        return step(model, cache, prompt_len, first, logprob, new_tokens), time.time()
    head = step(model, cache, prompt_len, first, logprob, 2)
    first_decode_at = time.time()
    if new_tokens == 2:
        return head, first_decode_at
    rest = step(model, cache, prompt_len + 1, head.tokens[1], head.logprobs[1], new_tokens - 1)
    from kvpolicy.demo.models import Generation

    return Generation(head.tokens[:1] + rest.tokens, head.logprobs[:1] + rest.logprobs), first_decode_at


def _serve(conn: Any, role: str) -> None:
    import os
    import warnings

    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("NIXL_LOG_LEVEL", "WARN")
    # UCX logs each refused TCP connect attempt at ERROR while it retries, and the retry succeeds
    # (the demo's own checks, token for token, are the verdict); a user's UCX_LOG_LEVEL still wins.
    os.environ.setdefault("UCX_LOG_LEVEL", "fatal")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    warnings.filterwarnings("ignore", category=UserWarning)
    warnings.filterwarnings("ignore", category=FutureWarning)
    side: _Side | None = None
    while True:
        try:
            if not conn.poll(_CALL_TIMEOUT_S * 4):
                return  # the parent is gone or idle far too long: never linger
            op, args = conn.recv()
        except (EOFError, OSError):
            return
        try:
            if op == "setup":
                if side is not None:
                    side.close()
                side = _Side(role, *args)
                result: Any = {
                    "address": side.transceiver.address,
                    "digest": side.digest,
                    "runtime": side.resolution.runtime,
                    "decided_by": dict(side.resolution.decided_by),
                }
            elif op == "connect":
                assert side is not None
                side.transceiver.connect(*args)
                result = None
            elif op == "prefill":
                assert side is not None
                result = side.prefill(*args)
            elif op == "decode":
                assert side is not None
                result = side.decode(*args)
            elif op == "exit":
                if side is not None:
                    side.close()
                conn.send(("ok", None))
                return
            else:
                raise ValueError(f"unknown op {op!r}")
            conn.send(("ok", result))
        except Exception as exc:  # reported to the parent, which raises it with the worker's traceback
            conn.send(("error", f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"))


# -- parent side --------------------------------------------------------------------------------


class Worker:
    """A prefill or decode worker process, driven over a pipe; every call has a timeout."""

    def __init__(self, role: str) -> None:
        context = multiprocessing.get_context("spawn")
        self.role = role
        self._conn, child = context.Pipe()
        self.process = context.Process(target=_serve, args=(child, role), name=f"kvpolicy-{role}", daemon=True)
        self.process.start()
        child.close()

    def call(self, op: str, *args: Any, timeout_s: float = _CALL_TIMEOUT_S) -> Any:
        """Run ``op`` in the worker; raise ``RuntimeError`` with its traceback if it failed."""
        self._conn.send((op, args))
        if not self._conn.poll(timeout_s):
            self.kill()
            raise TimeoutError(f"the {self.role} worker did not answer {op!r} within {timeout_s:.0f} s")
        status, result = self._conn.recv()
        if status != "ok":
            raise RuntimeError(f"the {self.role} worker failed in {op!r}: {result}")
        return result

    def stop(self) -> None:
        """Ask the worker to exit; kill it if it does not within 30 s."""
        if self.process.is_alive():
            try:
                self.call("exit", timeout_s=30)
            except (TimeoutError, RuntimeError, OSError, EOFError):
                pass
        self.process.join(30)
        self.kill()

    def kill(self) -> None:
        if self.process.is_alive():
            self.process.kill()
            self.process.join(10)


def run_model(
    prefill: Worker,
    decode: Worker,
    settings: RunSettings,
    prompts: Sequence[Sequence[int]],
    new_tokens: int,
    keys_dir: str,
) -> tuple[dict[str, Any], list[DecodeResult], list[dict[str, Any]]]:
    """Set both workers up for one model and run ``prompts`` in order through prefill -> decode.

    ``keys_dir`` is where both workers' keys are made; it is their allow-list, which the
    transceivers watch while they run, so the caller removes it only after the workers stopped.
    Returns the workers' set-up facts (runtime, deciding rule, weight digests), one decode result
    per prompt, and the prefill facts per prompt.
    """
    for role in ("prefill", "decode"):
        if not os.path.exists(os.path.join(keys_dir, f"{role}.key_secret")):
            create_keys(keys_dir, role, role)  # keys with their role: the workers are two processes
    prefill_info = prefill.call("setup", settings, keys_dir)
    decode_info = decode.call("setup", settings, keys_dir)
    if prefill_info["digest"] != decode_info["digest"]:
        raise RuntimeError("the two workers built different weights; the comparison would be meaningless")
    decode.call("connect", prefill_info["address"])
    results, prefills = [], []
    for index, prompt in enumerate(prompts):
        request_id = f"{settings.architecture}-{index}"
        facts = prefill.call("prefill", request_id, list(prompt))
        prefills.append(facts)
        results.append(decode.call("decode", request_id, list(prompt), facts["first"], facts["logprob"], new_tokens, facts["offered_at"]))
    return {"prefill": prefill_info, "decode": decode_info}, results, prefills
