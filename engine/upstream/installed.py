"""The installed TensorRT-LLM compared with the policy version a command chose, cached.

Reading and parsing a few hundred upstream files costs about a second; the answer depends only on
the installed package's files (its RECORD, which lists every file with its hash), the policy file
and kvpolicy's own code, so it is stored under the digest of the three (:mod:`kvpolicy.read.cache`):
the next ``kvpolicy resolve --verify-installed`` answers from the cache without reading upstream.
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["InstalledCheck", "check_installed"]

_KIND = "upstream-1"


@dataclass(frozen=True)
class InstalledCheck:
    release: str | None
    version: str
    drift: list[dict] = field(default_factory=list)
    cached: bool = False

    @property
    def matches(self) -> bool:
        return not self.drift

    def line(self) -> str:
        name = f"TensorRT-LLM {self.release}" if self.release else "the installed TensorRT-LLM"
        if self.matches:
            return f"upstream: {name} (installed) matches {self.version}: every row, field, environment name and fingerprint"
        kinds: dict[str, int] = {}
        for item in self.drift:
            kinds[item["kind"]] = kinds.get(item["kind"], 0) + 1
        shown = ", ".join(f"{n} {k}" for k, n in kinds.items())
        return f"upstream: {name} (installed) differs from {self.version} in {len(self.drift)} ways ({shown}); `kvpolicy upstream check --installed` lists them"


def check_installed(policy_set) -> InstalledCheck | None:
    """Drift between the installed ``tensorrt_llm`` and ``policy_set``'s version; None when none is installed."""
    from ..read.cache import cached_entry, code_fingerprint, digest, remember_entry
    from .drift import compare
    from .extract import extract
    from .source import TreeError, installed_tree, record_hash

    record = record_hash()
    if record is None:
        return None
    policy = policy_set.policy
    key = digest(record, policy.digest, code_fingerprint())
    hit = cached_entry(_KIND, key)
    if isinstance(hit, dict) and isinstance(hit.get("drift"), list) and all(isinstance(d, dict) and isinstance(d.get("kind"), str) for d in hit["drift"]):
        return InstalledCheck(hit.get("release") if isinstance(hit.get("release"), str) else None, policy.version, hit["drift"], cached=True)
    try:
        tree = installed_tree()
    except TreeError as exc:
        drift = [{"code": "UPS060", "kind": "unread", "message": str(exc)}]
        return InstalledCheck(None, policy.version, drift)
    found = compare(extract(tree), policy)
    drift = [{"code": d.code, "kind": d.kind, "message": d.message} for d in found]
    remember_entry(_KIND, key, {"release": tree.release, "drift": drift})
    return InstalledCheck(tree.release, policy.version, drift)
