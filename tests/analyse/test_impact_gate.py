"""``kvpolicy impact`` as a gate: new warnings and configs that keep failing are visible and can
fail the run; hostile config files are reported per file and the report goes on."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from kvpolicy.cli import main
from kvpolicy.read.loader import shipped_root

UCX_CPP = """\
model: some/model
context_servers:
  cache_transceiver_config:
    backend: UCX
    transceiver_runtime: CPP
generation_servers:
  cache_transceiver_config:
    backend: UCX
    transceiver_runtime: CPP
"""

UCX_PYTHON = UCX_CPP.replace("CPP", "PYTHON")

WARNING = """
[[constraints]]
id = "ucx-discouraged"
decision = "backend"
severity = "warning"
when = { backend = "UCX" }
message = "UCX is discouraged."
fix = "set backend to NIXL"
reason = "test"
source = "test"
"""


@pytest.fixture
def versions(tmp_path: Path) -> tuple[str, str]:
    text = (shipped_root() / "2026.09.10.toml").read_text(encoding="utf-8")
    old = tmp_path / "old.toml"
    old.write_text(text, encoding="utf-8")
    new = tmp_path / "new.toml"
    new.write_text(text.replace('version = "2026.09.10"', 'version = "2026.09.11"') + WARNING, encoding="utf-8")
    return str(old), str(new)


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def _arch_map(tmp_path: Path) -> str:
    path = tmp_path / "arch-map.yaml"
    path.write_text('"some/model": MistralForCausalLM\n')
    return str(path)


def test_a_new_warning_is_a_status_and_can_fail_the_run(capsys, tmp_path, versions) -> None:
    config = tmp_path / "configs" / "ucx.yaml"
    config.parent.mkdir()
    config.write_text(UCX_CPP)
    old, new = versions
    known = ("--arch-map", _arch_map(tmp_path))
    code, out, _ = run(capsys, "impact", "--configs", str(config.parent), "--from", old, "--to", new, *known)
    assert code == 0
    counts = next(line for line in out.splitlines() if line.startswith("  ") and "new warning" in line)
    assert "unchanged" not in counts
    code, out, _ = run(capsys, "impact", "--configs", str(config.parent), "--from", old, "--to", new, *known, "--fail-on", "new-warning")
    assert code == 1
    code, out, _ = run(capsys, "impact", "--configs", str(config.parent), "--from", old, "--to", new, *known, "--format", "github")
    assert out.startswith("::warning file=") and "new warning" in out
    # Without the map the model is unknown; the warning is new for most models, Kimi K3 (which
    # refuses UCX) fails under both: the status depends on the model, and no model starts failing.
    code, out, _ = run(capsys, "impact", "--configs", str(config.parent), "--from", old, "--to", new)
    assert code == 0 and "1 architecture unknown" in out and "still failing for KimiK3ForConditionalGeneration" in out
    assert run(capsys, "impact", "--configs", str(config.parent), "--from", old, "--to", new, "--fail-on", "unknown")[0] == 1


def test_still_failing_is_annotated_and_can_fail_the_run(capsys, tmp_path, versions) -> None:
    config = tmp_path / "configs" / "python-ucx.yaml"
    config.parent.mkdir()
    config.write_text(UCX_PYTHON)
    old, _ = versions
    argv = ["impact", "--configs", str(config.parent), "--from", old, "--to", old]
    code, out, _ = run(capsys, *argv)
    assert code == 0 and "still failing" in out
    assert run(capsys, *argv, "--fail-on", "still-failing")[0] == 1
    assert run(capsys, *argv, "--fail-on", "failing,still-failing")[0] == 1
    code, out, _ = run(capsys, *argv, "--format", "github")
    assert out.count("::error file=") == 2 and "still failing" in out and ",line=3::" in out


def test_unknown_fail_on_is_a_usage_error(capsys, versions) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["impact", "--configs", ".", "--from", versions[0], "--to", versions[0], "--fail-on", "sometimes"])
    assert exc.value.code == 2
    assert "expected one or more of failing, still-failing, malformed, new-warning, unknown, change, never" in capsys.readouterr().err


def _hostile(folder: Path) -> dict[str, str]:
    """name -> the message expected for it."""
    (folder / "deep.yaml").write_text("cache_transceiver_config: " + "[" * 50_000 + "]" * 50_000 + "\n")
    bomb = ['a: &a ["x","x","x","x","x","x","x","x","x"]']
    for level in range(1, 9):
        previous, current = chr(ord("a") + level - 1), chr(ord("a") + level)
        bomb.append(f"{current}: &{current} [" + ",".join([f"*{previous}"] * 9) + "]")
    (folder / "bomb.yaml").write_text("\n".join(bomb) + "\ncache_transceiver_config: {backend: NIXL}\n")
    (folder / "dup.yaml").write_text("cache_transceiver_config:\n  backend: NIXL\n  backend: UCX\n")
    (folder / "dup.json").write_text('{"cache_transceiver_config": {"backend": "NIXL", "backend": "UCX"}}')
    (folder / "deep.json").write_text("[" * 50_000 + "]" * 50_000)
    with open(folder / "big.yaml", "wb") as big:
        big.truncate(5 << 20)  # sparse: the size is refused by stat before a byte is read
    os.mkfifo(folder / "fifo.yaml")
    return {
        "deep.yaml": "deep.yaml:1:",
        "bomb.yaml": "aliases expand to more than",
        "dup.yaml": "dup.yaml:3:3: error: invalid YAML: duplicate key 'backend' (first at line 2)",
        "dup.json": "dup.json:1:50: error: duplicate key 'backend'",
        "deep.json": "deep.json:1:65: error: nested more than 64 levels deep",
        "big.yaml": "config files are limited to",
        "fifo.yaml": "not a regular file (a FIFO)",
    }


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs")
def test_hostile_configs_are_located_errors_and_the_report_goes_on(capsys, tmp_path) -> None:
    folder = tmp_path / "configs"
    folder.mkdir()
    expected = _hostile(folder)
    (folder / "good.yaml").write_text(UCX_CPP)
    code, out, err = run(capsys, "impact", "--configs", str(folder), "--from", "2026.09.10", "--to", "2026.09.10", "--fail-on", "malformed")
    assert code == 1 and "Traceback" not in out + err
    assert f"gate: fails (exit 1) on {len(expected)} configs malformed (--fail-on malformed)" in out
    for name, message in expected.items():
        assert message in out, name
    assert "good.yaml" in out and "unchanged" in out


def test_the_gate_fails_on_what_the_edit_breaks_not_on_configs_malformed_under_both(capsys, tmp_path) -> None:
    # A folder like upstream's: one config the edit makes fail beside one no version can read.
    folder = tmp_path / "configs"
    folder.mkdir()
    (folder / "broken.yaml").write_text("cache_transceiver_config: {backend: ucx}\n")
    argv = ("impact", "--configs", str(folder / "broken.yaml"), "--from", "2026.08.24", "--to", "2026.09.02")
    code, out, _ = run(capsys, *argv)
    assert code == 0 and "1 config malformed under both versions" in out
    code, out, err = run(capsys, *argv, "--fail-on", "still-failing", "--format", "json")
    assert code == 1 and "gate: fails (exit 1) on 1 config malformed (--fail-on still-failing)" in err
    # Llama on UCX: PYTHON preferred verbatim since #18134, so the edit 2026.08.18 -> 2026.08.24 breaks it.
    (folder / "llama.yaml").write_text("model: llama\ncache_transceiver_config: {backend: UCX}\n")
    (folder / "map.yaml").write_text("llama: LlamaForCausalLM\n")
    code, out, _ = run(capsys, "impact", "--configs", str(folder / "llama.yaml"), str(folder / "broken.yaml"),
                       "--arch-map", str(folder / "map.yaml"), "--from", "2026.08.18", "--to", "2026.08.24")
    assert code == 1
    assert "gate: fails (exit 1) on 1 config starts failing (--fail-on failing)" in out
