"""``kvpolicy versions`` and ``kvpolicy table``: what ships, and what each version decides."""

from __future__ import annotations

import json
from typing import Any

from ..errors import PolicyError
from ..evaluate.policyset import load
from .common import POLICIES_DEFAULT, add_policy_arguments, choose_policies, fail, load_from_args

__all__ = ["register"]


def register(sub: Any) -> None:
    """Add ``versions`` and ``table``."""
    parser = sub.add_parser("versions", help="list the policy versions", description="List the policy versions.")
    parser.add_argument("--policy", metavar="PATH", help=f"a policy file or folder ({POLICIES_DEFAULT})")
    parser.add_argument("--format", choices=("text", "json"), default="text")
    parser.set_defaults(run=run_versions)

    parser = sub.add_parser(
        "table",
        help="print what a version resolves for every architecture it names and every backend",
        description="Print the resolution table of a policy version (runtime auto, default timeout).",
    )
    add_policy_arguments(parser)
    parser.add_argument("--format", choices=("text", "json"), default="text")
    parser.set_defaults(run=run_table)


def run_versions(args: Any) -> int:
    """List every version with its summary and digest; the newest is the default.

    The JSON output stays a list (one object per version): scripts index it; the text output
    names the policies used on its first line."""
    source = choose_policies(args.policy)
    if isinstance(source, int):
        return source
    try:
        newest = load(source.path)
        sets = [newest if v == newest.version else load(source.path, version=v) for v in newest.versions()]
    except PolicyError as exc:
        return fail(str(exc))
    if args.format == "json":
        print(
            json.dumps(
                [{"version": s.version, "summary": s.policy.summary, "digest": s.digest, "path": s.path, "default": s.version == newest.version} for s in sets],
                indent=2,
            )
        )
        return 0
    print(source.describe())
    for s in sets:
        mark = "*" if s.version == newest.version else " "
        print(f"{mark} {s.version}  {s.digest[:12]}  {s.policy.summary}")
    print("\n* the default (newest) version")
    return 0


def run_table(args: Any) -> int:
    """Resolve every named architecture (and one without a preference) on every backend."""
    from ..analyse.matrix import columns_of, decision_matrix, rows_of

    source = choose_policies(args.policy)
    if isinstance(source, int):
        return source
    policy_set = load_from_args(args, source)
    if isinstance(policy_set, int):
        return policy_set
    policy = policy_set.policy
    matrix = decision_matrix(policy_set, columns=columns_of(policy, routes=False), rows=rows_of(policy, model_types=False))
    backends = [column.backend for column in matrix.columns]
    rows = []
    for r, (architecture, _) in enumerate(matrix.rows):
        cells: dict[str, dict[str, Any]] = {}  # each as its JSON shows it
        for c, backend in enumerate(backends):
            resolution = matrix.cell(r, c).resolution
            cells[backend] = {
                "backend": resolution.backend,
                "transceiver_runtime": resolution.runtime,
                "kv_cache_manager": resolution.kv_cache_manager,
                "decided_by": resolution.decided_by["transceiver_runtime"],
                "errors": [d.id for d in resolution.errors],
            }
        rows.append((architecture, cells))
    if args.format == "json":
        print(
            json.dumps(
                {
                    "policies": source.to_dict(),
                    "policy_version": policy_set.version,
                    "rows": [{"architecture": a, "backends": c} for a, c in rows],
                },
                indent=2,
            )
        )
        return 0
    print(source.describe())
    print(f"policy {policy_set.version}: transceiver_runtime auto, kv_transfer_timeout_ms 60000, no features\n")
    names = [a or "(any other architecture)" for a, _ in rows]
    width = max(len(n) for n in names)
    header = f"{'architecture':<{width}}  " + "  ".join(f"{b:<12}" for b in backends)
    print(header)
    print("-" * len(header))
    for name, (_, cells) in zip(names, rows):
        texts = []
        for backend in backends:
            cell = cells[backend]
            text = cell["transceiver_runtime"] + ("/V2" if cell["kv_cache_manager"] == "V2" else "")
            texts.append(f"{text + ('!' if cell['errors'] else ''):<12}")
        print(f"{name:<{width}}  " + "  ".join(texts))
    print("\n! fails at start-up (run `kvpolicy explain --arch NAME --backend B` for why); /V2: KV-cache manager V2")
    return 0
