"""``kvpolicy demo``: a disaggregated prefill -> decode run through the runtime the policy chose.

For each model: resolve the runtime from the model's own config, print the decision and why, then
run a prefill worker and a decode worker (real processes, real NIXL transfers) and check that the
decode side generates exactly what a single process generates. A second request sharing a prompt
prefix shows block reuse on the decode side. Exit 0 only when every model matched.

Everything heavy (torch, transformers, nixl) is imported only when this command runs.
"""

from __future__ import annotations

import json
import tempfile
import random
import sys
from typing import Any

from ..errors import ContextError, PolicyError
from ..evaluate.policyset import load
from .common import fail

__all__ = ["register"]

ARCHITECTURES = ("LlamaForCausalLM", "Gemma3ForCausalLM", "MistralForCausalLM")
_LOGPROB_TOLERANCE = 1e-5


def register(sub: Any) -> None:
    """Add ``demo``."""
    parser = sub.add_parser(
        "demo",
        help="run prefill -> decode on real models through the runtime the policy chose",
        description=__doc__.splitlines()[0] if __doc__ else None,
    )
    parser.add_argument("--backend", default="NIXL", help="cache_transceiver_config.backend (default NIXL)")
    parser.add_argument("--runtime", default="auto", help="transceiver_runtime (default auto)")
    parser.add_argument("--policy", metavar="PATH", help="a policy file or folder (default: the shipped policies)")
    parser.add_argument("--policy-version", "--version", dest="policy_version", metavar="V")
    parser.add_argument("--arch", action="append", choices=ARCHITECTURES, help="run only these (repeatable)")
    parser.add_argument("--model-size", default="small", choices=("tiny", "small", "medium"))
    parser.add_argument("--prompt-len", type=int, default=32)
    parser.add_argument("--new-tokens", type=int, default=16)
    parser.add_argument("--tokens-per-block", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default="cpu", help="cpu, or cuda for VRAM-to-VRAM transfers")
    parser.add_argument("--format", choices=("text", "json"), default="text")
    parser.set_defaults(run=run)


def _why(resolution: Any) -> str:
    for step in resolution.trace:
        if step.decision == "transceiver_runtime" and step.outcome == "decided":
            return step.detail
    return ""


def run(args: Any) -> int:
    """Resolve every model; stop with exit 1 before starting workers if any resolution fails."""
    if args.prompt_len < 2 or args.new_tokens < 1 or args.tokens_per_block < 1:
        return fail("--prompt-len must be at least 2, --new-tokens and --tokens-per-block at least 1")
    architectures = tuple(args.arch or ARCHITECTURES)
    try:
        policy = load(args.policy, version=args.policy_version)
    except PolicyError as exc:
        return fail(str(exc))
    config = {"backend": None if args.backend.lower() == "null" else args.backend, "transceiver_runtime": args.runtime}
    resolutions = {}
    for architecture in architectures:
        try:
            # The model's own config decides: architectures[0] as a checkpoint's config.json has it.
            resolutions[architecture] = policy.resolve(config, pretrained_config={"architectures": [architecture]})
        except ContextError as exc:
            return fail(f"invalid context: {exc}")
    text = args.format == "text"
    if text:
        print(f"policy {policy.version}: backend {args.backend}, transceiver_runtime {args.runtime}\n")
        for architecture, r in resolutions.items():
            decided = r.decided_by.get("transceiver_runtime", "-")
            print(f"  {architecture:<20} -> {r.runtime or 'off'} on {r.backend or '-'}  ({decided}: {_why(r)})")
        print()
    failed = {a: r for a, r in resolutions.items() if not r.ok or not r.enabled}
    missing = {}
    if not failed:
        from ..transports.selection import TransceiverSelectionError, find_transceiver

        for architecture, r in resolutions.items():
            try:
                find_transceiver(r)
            except TransceiverSelectionError as exc:
                missing[architecture] = str(exc)
    if missing:
        for architecture, message in missing.items():
            if text:
                print(f"{architecture}: error: {message}")
            else:
                print(
                    json.dumps(
                        {
                            "architecture": architecture,
                            "runtime": resolutions[architecture].runtime,
                            "ok": False,
                            "errors": [{"id": "transceiver-not-installed", "message": message}],
                        }
                    )
                )
        if text:
            print("\nstopped before starting any worker: no transceiver here moves the runtime decided above")
        return 1
    if failed:
        for architecture, r in failed.items():
            if not r.enabled:
                message = "disaggregation is off (backend null): there is nothing to transfer"
                print(f"{architecture}: {message}", file=sys.stderr if not text else sys.stdout)
            for error in r.errors:
                if text:
                    print(f"{architecture}: error[{error.id}]: {error.message}\n  --> {error.location}")
                else:
                    print(json.dumps({"architecture": architecture, "runtime": r.runtime, "ok": False, "errors": [e._asdict() for e in r.errors]}))
        if text:
            print("\nstopped before starting any worker: fix the errors above (or pick another --policy-version)")
        return 1
    return _run_workers(args, architectures, policy, config, resolutions)


def _run_workers(args: Any, architectures: tuple[str, ...], policy: Any, config: dict[str, Any], resolutions: dict[str, Any]) -> int:
    import os
    import warnings

    os.environ.setdefault("NIXL_LOG_LEVEL", "WARN")
    # UCX logs each refused TCP connect attempt at ERROR while it retries, and the retry succeeds
    # (the demo's own checks, token for token, are the verdict); a user's UCX_LOG_LEVEL still wins.
    os.environ.setdefault("UCX_LOG_LEVEL", "fatal")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    warnings.filterwarnings("ignore", category=UserWarning)
    warnings.filterwarnings("ignore", category=FutureWarning)
    from rich.console import Console
    from rich.progress import Progress
    from rich.table import Table

    from ..demo.disagg import RunSettings, Worker, run_model
    from ..demo.models import ModelSpec, build_model, reference_generation

    console = Console(stderr=True)
    rows: list[dict[str, Any]] = []
    prefill, decode = Worker("prefill"), Worker("decode")
    # The workers' keys and allow-list: watched by their transceivers while they run, so removed
    # only once both workers have stopped (removing it earlier made every run warn).
    keys = tempfile.TemporaryDirectory(prefix="kvpolicy-demo-keys-")
    try:
        with Progress(console=console, transient=True, disable=args.format != "text") as progress:
            task = progress.add_task("starting workers", total=len(architectures))
            for index, architecture in enumerate(architectures):
                progress.update(task, description=f"{architecture}: prefill -> decode")
                seed = args.seed + index
                model, model_config = build_model(ModelSpec(architecture, args.model_size, seed))
                model.to(args.device)  # the reference runs where the decode side runs
                rng = random.Random(seed)
                prompt = [rng.randrange(model_config.vocab_size) for _ in range(args.prompt_len)]
                # The second request shares every full block but the last with the first.
                shared = max(args.tokens_per_block, (args.prompt_len // args.tokens_per_block - 1) * args.tokens_per_block)
                shared = min(shared, args.prompt_len - 1)
                second = prompt[:shared] + [rng.randrange(model_config.vocab_size) for _ in range(args.prompt_len - shared)]
                settings = RunSettings(
                    architecture,
                    args.policy,
                    policy.version,
                    config,
                    args.model_size,
                    seed,
                    args.tokens_per_block,
                    num_blocks=4 * (args.prompt_len // args.tokens_per_block + 2),
                    device=args.device,
                )
                info, results, _ = run_model(prefill, decode, settings, [prompt, second], args.new_tokens, keys.name)
                references = [reference_generation(model, p, args.new_tokens) for p in (prompt, second)]
                first, reuse = results
                matches = [r.tokens == ref.tokens for r, ref in zip(results, references)]
                drift = max(abs(a - b) for r, ref in zip(results, references) for a, b in zip(r.logprobs, ref.logprobs))
                resolution = resolutions[architecture]
                rows.append(
                    {
                        "architecture": architecture,
                        "runtime": resolution.runtime,
                        "backend": resolution.backend,
                        "decided_by": resolution.decided_by["transceiver_runtime"],
                        "worker_decided_by": info["prefill"]["decided_by"]["transceiver_runtime"],
                        "policy_version": resolution.policy_version,
                        "tokens_match": all(matches) and drift <= _LOGPROB_TOLERANCE,
                        "tokens": list(first.tokens),
                        "max_logprob_diff": drift,
                        "bytes": first.nbytes,
                        "gbps": first.gbps,
                        "descriptors": first.descriptors,
                        "first_decode_token_ms": first.first_decode_token_s * 1000,
                        "prefix_reuse": {
                            "tokens_match": matches[1],
                            "blocks_total": reuse.blocks_total,
                            "blocks_received": reuse.blocks_received,
                            "bytes": reuse.nbytes,
                        },
                    }
                )
                progress.advance(task)
    finally:
        prefill.stop()
        decode.stop()
        keys.cleanup()

    if args.format == "json":
        for row in rows:
            print(json.dumps(row))
    else:
        table = Table(title=f"prefill -> decode, {args.model_size} models, prompt {args.prompt_len}, {args.new_tokens} new tokens")
        for column in ("architecture", "runtime", "tokens match", "max |dlogp|", "bytes", "GB/s", "1st decode token", "prefix reuse"):
            table.add_column(column)
        for row in rows:
            reuse = row["prefix_reuse"]
            table.add_row(
                row["architecture"],
                row["runtime"],
                "yes" if row["tokens_match"] else "NO",
                f"{row['max_logprob_diff']:.1e}",
                f"{row['bytes']:,}",
                f"{row['gbps']:.3f}",
                f"{row['first_decode_token_ms']:.1f} ms",
                f"{reuse['blocks_received']}/{reuse['blocks_total']} blocks, {'match' if reuse['tokens_match'] else 'MISMATCH'}",
            )
        Console(width=None if sys.stdout.isatty() else 140).print(table)
    return 0 if all(row["tokens_match"] and row["prefix_reuse"]["tokens_match"] for row in rows) else 1
