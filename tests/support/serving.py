"""Serving configs and checkpoints for the tests of ``kvpolicy resolve --config`` and model identity."""

from __future__ import annotations

import json
from pathlib import Path

from kvpolicy.cli import main

from tests.support.constants import REPO

#: The version the identity tests resolve against.
VERSION = "2026.09.10"

#: A disaggregated config whose servers all ask for UCX; ``{model}`` names the model.
DISAGG_UCX = """\
model: {model}
backend: pytorch
context_servers:
  num_instances: 1
  cache_transceiver_config:
    backend: UCX
generation_servers:
  num_instances: 1
  cache_transceiver_config:
    backend: UCX
"""


def checkpoint(folder: Path, architecture: str | None, model_type: str | None = None, **extra) -> Path:
    """A checkpoint folder whose config.json names ``architecture`` and ``model_type`` (and ``extra``)."""
    folder.mkdir(parents=True, exist_ok=True)
    data = {"model_type": model_type, **extra}
    if architecture is not None:
        data["architectures"] = [architecture]
    (folder / "config.json").write_text(json.dumps(data), encoding="utf-8")
    return folder


def resolve_config(capsys, path: Path, *extra: str) -> tuple[int, str, str]:
    """``kvpolicy resolve --config PATH`` against :data:`VERSION`: (exit code, stdout, stderr)."""
    code = main(["resolve", "--config", str(path), "--version", VERSION, "--policy", str(REPO / "policies"), *extra])
    out, err = capsys.readouterr()
    return code, out, err
