"""Small policies for tests: writing one to a folder, and the three-decision skeleton that tests of
the analysis and the domain fill with the rules they need."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path


def write(tmp_path: Path, text: str, name: str = "policy.toml") -> Path:
    """Write ``text`` to ``tmp_path/name``; returns the path."""
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def _decision(name: str, values: Sequence[str], auto: str, default: str, inputs: Sequence[str], rules: str) -> str:
    listed = ", ".join(f'"{v}"' for v in values)
    lines = [f"[decisions.{name}]", f'description = "{name}"', f"values = [{listed}]", f'auto = "{auto}"']
    if inputs:
        lines.append("inputs = [" + ", ".join(f'"{i}"' for i in inputs) + "]")
    short = {"backend": "backend", "transceiver_runtime": "runtime", "kv_cache_manager": "manager"}[name]
    lines.append(f'default = {{ id = "{short}-default", value = "{default}" }}')
    text = "\n".join(lines) + "\n"
    return text + ("\n" + rules.strip("\n") + "\n" if rules.strip() else "")


def three_decisions(
    *,
    summary: str = "test",
    features: Mapping[str, str | None] | None = None,
    backend_auto: str = "auto",
    runtime_default: str = "CPP",
    runtime_inputs: Sequence[str] = (),
    manager_inputs: Sequence[str] = (),
    backend: str = "",
    runtime: str = "",
    manager: str = "",
) -> str:
    """A policy of the three decisions (backend NIXL|UCX defaulting to NIXL, transceiver_runtime
    CPP|PYTHON, kv_cache_manager V1|V2 defaulting to V1), each described by its name, with default
    ids ``backend-default``, ``runtime-default`` and ``manager-default``.

    ``features`` maps each feature's name to the variable that turns it on (or None);
    ``backend``, ``runtime`` and ``manager`` are TOML rules (conditionals, requirements,
    adjustments, preferences) appended to that decision. Constraints are appended by the caller.
    """
    parts = ['schema = 1\nversion = "2026.01.01"\n' f'summary = "{summary}"\nsource = "test"\n']
    if features:
        for name, env in features.items():
            parts.append(f'[features.{name}]\ndescription = "{name}"\n' + (f'env = "{env}"\n' if env else ""))
    else:
        parts[0] += "features = {}\n"
    parts.append(_decision("backend", ("NIXL", "UCX"), backend_auto, "NIXL", (), backend))
    parts.append(_decision("transceiver_runtime", ("CPP", "PYTHON"), "auto", runtime_default, runtime_inputs, runtime))
    parts.append(_decision("kv_cache_manager", ("V1", "V2"), "auto", "V1", manager_inputs, manager))
    return "\n".join(parts)
