"""The drafted version's test cases: the base version's, plus one per preference row the draft wrote.

A drafted row's case asks what the row states (the architecture on NIXL with every decision left to
``auto``) and expects the row's value; where the version's adoption rules say otherwise, ``kvpolicy
test`` fails on it and a person corrects the case or the row. Cases of the base version that the
drafted rows change fail the same way: the draft never rewrites an expectation it has not checked.
"""

from __future__ import annotations

from .drift import Drift

__all__ = ["draft_cases"]


def _quote(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def draft_cases(text: str, base_name: str, new_name: str, drift: list[Drift]) -> str:
    lines = text.splitlines(keepends=True)
    for index, line in enumerate(lines):
        if not line.lstrip().startswith("#"):
            break
        lines[index] = line.replace(base_name, new_name)
    out = "".join(lines).rstrip("\n") + "\n"
    for item in drift:
        if item.kind not in ("row-missing", "row-changed") or item.architecture is None or item.new is None:
            continue
        name = f"{item.architecture} prefers {item.new} ({item.decision}; drafted by kvpolicy upstream)"
        context = f'{{ architecture = {_quote(item.architecture)}, backend = "NIXL", transceiver_runtime = "auto", kv_cache_manager = "auto" }}'
        out += f"\n[[case]]\nname = {_quote(name)}\ncontext = {context}\nexpect = {{ {item.decision} = {_quote(item.new)} }}\n"
    return out
