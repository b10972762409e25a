"""The installed TensorRT-LLM checked against the version a command chose (``--verify-installed``,
``upstream check --installed``): found through its distribution metadata, never imported, and cached
by its RECORD so only the first run reads it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

KVPOLICY = Path(sys.executable).with_name("kvpolicy")

MODELING = """
def register_auto_model(name):
    def wrap(cls):
        return cls
    return wrap


@register_auto_model("LlamaForCausalLM")
class LlamaForCausalLM:
    @classmethod
    def get_preferred_transceiver_runtime(cls, pretrained_config=None):
        return "CPP"
"""


def _site(tmp_path: Path, version: str = "1.4.0rc1") -> Path:
    """A site folder holding an installed tensorrt_llm: metadata, RECORD and a tiny package that
    would fail if imported (it raises), so a check that imported it could not pass."""
    site = tmp_path / "site"
    package = site / "tensorrt_llm"
    models = package / "_torch" / "models"
    models.mkdir(parents=True)
    (package / "__init__.py").write_text("raise ImportError('tensorrt_llm must never be imported by kvpolicy')\n")
    (package / "version.py").write_text(f'__version__ = "{version}"\n')
    (models / "modeling_llama.py").write_text(MODELING)
    info = site / f"tensorrt_llm-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: tensorrt_llm\nVersion: {version}\n")
    (info / "RECORD").write_text("tensorrt_llm/__init__.py,,\ntensorrt_llm/_torch/models/modeling_llama.py,,\n")
    return site


def _run(site: Path, cache: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(site), "KVPOLICY_CACHE_DIR": str(cache)}
    return subprocess.run([str(KVPOLICY), *args], capture_output=True, text=True, env=env, timeout=120, check=False)


def test_verify_installed_refuses_a_version_that_does_not_model_what_is_installed(tmp_path: Path) -> None:
    site = _site(tmp_path)
    out = _run(site, tmp_path / "cache", "resolve", "--arch", "LlamaForCausalLM", "--verify-installed")
    assert out.returncode == 4, out.stderr
    assert "TensorRT-LLM 1.4.0rc1 (installed) differs from 2026.10.22" in out.stderr
    assert "row-changed" in out.stderr  # Llama's hook says CPP here; the version says PYTHON
    assert "--accept-unmodelled" in out.stderr and "kvpolicy upstream check --installed" in out.stderr


def test_verify_installed_with_accept_answers_and_says_what_differs(tmp_path: Path) -> None:
    site = _site(tmp_path)
    out = _run(site, tmp_path / "cache", "resolve", "--arch", "LlamaForCausalLM", "--verify-installed", "--accept-unmodelled")
    assert out.returncode == 0, out.stderr
    assert "upstream: TensorRT-LLM 1.4.0rc1 (installed) differs from 2026.10.22" in out.stdout


def test_upstream_check_installed_lists_the_drift(tmp_path: Path) -> None:
    site = _site(tmp_path)
    out = _run(site, tmp_path / "cache", "upstream", "check", "--installed")
    assert out.returncode == 1, out.stderr
    assert "UPS003 row-changed: LlamaForCausalLM: the version says PYTHON, the tree CPP" in out.stdout
    assert "tensorrt_llm/_torch/models/modeling_llama.py:12" in out.stdout


def test_the_answer_is_cached_by_the_record(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    site = _site(tmp_path)
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.setenv("KVPOLICY_CACHE_DIR", str(tmp_path / "cache"))
    import kvpolicy
    from kvpolicy.upstream.installed import check_installed

    policies = kvpolicy.load(version="2026.10.22")
    first = check_installed(policies)
    again = check_installed(policies)
    assert first is not None and again is not None
    assert (first.cached, again.cached) == (False, True)
    assert first.drift == again.drift and not first.matches
    # A changed package (its RECORD) is read again.
    (site / "tensorrt_llm-1.4.0rc1.dist-info" / "RECORD").write_text("changed\n")
    assert check_installed(policies).cached is False


def test_without_tensorrt_llm_verify_installed_is_bad_input(tmp_path: Path) -> None:
    out = _run(tmp_path, tmp_path / "cache", "resolve", "--arch", "LlamaForCausalLM", "--verify-installed")
    assert out.returncode == 2
    assert "tensorrt_llm is not installed" in out.stderr
