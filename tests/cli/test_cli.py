"""The CLI: golden text output, stable JSON, exit codes, and a start-up that never loads torch.

Golden files live in tests/cli/golden/; after an intended change of output, regenerate them
with ``KVPOLICY_UPDATE_GOLDEN=1 pytest tests/cli/test_cli.py`` and review the diff.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

from kvpolicy.cli import main
from tests.support import golden

GOLDEN = Path(__file__).parent / "golden"
REPO = Path(__file__).resolve().parents[2]


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def check_golden(name: str, text: str) -> None:
    golden.check_golden(GOLDEN / name, text)


@pytest.fixture(autouse=True)
def _in_repo(monkeypatch):
    # Locations print relative to the working directory; pin it so golden files are stable.
    monkeypatch.chdir(REPO)


@pytest.mark.parametrize(
    ("name", "argv", "code"),
    [
        ("resolve_llama_nixl.txt", ["resolve", "--arch", "LlamaForCausalLM", "--backend", "NIXL"], 0),
        ("resolve_llama_ucx.txt", ["resolve", "--arch", "LlamaForCausalLM", "--backend", "UCX"], 1),
        ("resolve_off.txt", ["resolve", "--arch", "LlamaForCausalLM", "--backend", "null"], 0),
        # DeepSeek-V4 keeps V2 with C++ there: depends on the model
        ("resolve_env.txt", ["resolve", "--env", "TRTLLM_USE_UCX_KVCACHE=1", "--version", "2026.07.09"], 3),
        ("explain_kimi_cpp.txt", ["explain", "--arch", "KimiLinearForCausalLM", "--runtime", "CPP"], 1),
        ("versions.txt", ["versions"], 0),
        ("table_2026.08.11.txt", ["table", "--version", "2026.08.11"], 0),
    ],
)
def test_text_output(capsys, name, argv, code):
    exit_code, out, err = run(capsys, *argv)
    assert exit_code == code, err
    check_golden(name, out)


def test_model_config_json(capsys, tmp_path):
    checkpoint = tmp_path / "gemma"
    checkpoint.mkdir()
    (checkpoint / "config.json").write_text(json.dumps({"architectures": ["Gemma3ForCausalLM"], "model_type": "gemma3_text"}))
    code, out, _ = run(capsys, "resolve", "--model", str(checkpoint), "--backend", "NIXL", "--format", "json", "--version", "2026.08.11")
    data = json.loads(out)
    assert code == 0
    assert data["values"]["transceiver_runtime"] == "PYTHON"
    assert data["decided_by"]["transceiver_runtime"] == "runtime-preference[Gemma3ForCausalLM]"
    assert data["context"]["model_type"] == "gemma3_text"
    assert data["policy_version"] == "2026.08.11"


def test_json_is_stable_for_scripts(capsys):
    code, out, _ = run(capsys, "explain", "--arch", "GptOssForCausalLM", "--backend", "UCX", "--runtime", "auto",
                       "--kv-cache-manager", "auto", "--format", "json")
    data = json.loads(out)
    assert code == 1
    assert set(data) - {"policies"} == {
        "policy_version", "policy_digest", "enabled", "ok", "values", "decided_by", "diagnostics", "context", "trace", "verdict"
    }
    assert data["verdict"]["status"] == "cannot start" and data["verdict"]["architecture_known"] is True
    assert data["policies"] == {"path": "./policies", "origin": "working-directory"}
    assert data["diagnostics"][0]["id"] == "python-requires-nixl"
    assert {"decision", "stage", "rule", "outcome", "detail"} == set(data["trace"][0])


@pytest.mark.parametrize(
    ("argv", "fragment"),
    [
        (["resolve", "--backend", "nixl"], "did you mean 'NIXL'"),
        (["resolve", "--timeout-ms", "soon"], "--timeout-ms"),
        (["resolve", "--env", "NOEQUALS"], "KEY=VALUE"),
        (["resolve", "--feature", "cancel"], "unknown feature"),
        (["resolve", "--model", "/nonexistent/config.json"], "cannot read"),
        (["resolve", "--policy", "/nonexistent"], "no such policy file or folder"),
        (["resolve", "--version", "1999.01.01"], "no policy version 1999.01.01"),
        (["bogus"], "invalid choice"),
    ],
)
def test_usage_errors_exit_2(capsys, argv, fragment):
    with pytest.raises(SystemExit) as info:
        raise SystemExit(main(argv))
    out, err = capsys.readouterr()
    assert info.value.code == 2
    assert fragment in err
    assert "Traceback" not in err


def test_broken_policy_exits_2_with_location(capsys, tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text('schema = 1\nversion = "2026.01.01"\nsummary = "x"\nsource = "y"\nfeatures = {}\ndecisions = { backend = 3 }\n')
    code, _, err = run(capsys, "resolve", "--policy", str(bad))
    assert code == 2
    assert f"{bad}:6:" in err and "expected object" in err


@pytest.mark.parametrize(
    "argv",
    [
        ["resolve", "--arch", "LlamaForCausalLM"],
        ["explain", "--arch", "KimiLinearForCausalLM"],
        ["versions"],
        # One file and the smallest pair: a command imports the same modules whatever it reads.
        ["lint", "policies/2026.07.09.toml"],
        ["diff", "2026.07.09", "2026.07.20"],
        ["impact", "--configs", "examples/configs", "--from", "2026.07.09", "--to", "2026.07.20",
         "--arch-map", "examples/configs/arch-map.yaml"],
    ],
)
def test_policy_commands_never_import_torch_or_nixl(argv):
    probe = (
        "import sys; from kvpolicy.cli import main; code = main(sys.argv[1:]); "
        "heavy = [m for m in ('torch', 'nixl', 'zmq', 'numpy', 'transformers') if m in sys.modules]; "
        "print(heavy)"
    )
    done = subprocess.run([sys.executable, "-c", probe, *argv], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert "Traceback" not in done.stderr, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "[]"


def test_a_cold_resolve_imports_only_what_it_uses():
    """``kvpolicy resolve`` is what serving scripts run at start-up: it never imports the
    serving-config readers, lint or the diff (``resolve --config`` imports what it needs when asked),
    and once the policy's results are cached (the second run) no ``typing``, ``dataclasses`` or
    ``inspect`` either (~15 ms together here: they come with loading a policy)."""
    probe = (
        "import sys; from kvpolicy.cli import main; code = main(sys.argv[1:]); "
        "print(sorted(m for m in sys.modules if m in ('typing', 'dataclasses', 'inspect') "
        "or m.startswith(('kvpolicy.serving', 'kvpolicy.lint', 'kvpolicy.analyse'))))"
    )
    argv = ["resolve", "--arch", "LlamaForCausalLM", "--backend", "NIXL"]
    found = []
    for _ in range(2):
        done = subprocess.run([sys.executable, "-c", probe, *argv], capture_output=True, text=True, timeout=120, cwd=REPO)
        assert "Traceback" not in done.stderr, done.stderr
        found.append(ast.literal_eval(done.stdout.strip().splitlines()[-1]))
    assert [m for m in found[0] if m.startswith("kvpolicy")] == [] and found[1] == []


def test_python_dash_m(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "kvpolicy", "resolve", "--arch", "KimiLinearForCausalLM", "--runtime", "CPP"],
        capture_output=True, text=True, timeout=60, cwd=REPO,
    )
    assert done.returncode == 1
    assert "kimi-k3-requires-python" in done.stdout


@pytest.mark.parametrize(
    ("argv", "usage"),
    [
        (["resolve", "--arch", "LlamaForCausalLM", "--bogus"], "usage: kvpolicy resolve "),
        (["lint", "policies", "--bogus", "x"], "usage: kvpolicy lint "),
        (["--bogus", "versions"], "usage: kvpolicy versions "),
        (["keys", "show", "k.key", "--bogus"], "usage: kvpolicy keys show "),
    ],
)
def test_an_unknown_argument_prints_the_sub_command_usage(capsys, argv, usage):
    with pytest.raises(SystemExit) as info:
        main(argv)
    out, err = capsys.readouterr()
    assert info.value.code == 2 and out == ""
    assert err.startswith(usage), err
    assert "usage: kvpolicy [-h]" not in err
    assert err.rstrip().endswith("error: unrecognized arguments: " + " ".join(a for a in argv if a in ("--bogus", "x")))


def test_explain_shows_an_empty_value_visibly(capsys):
    """A condition on an environment variable set to "" reads `is not "" or UCX`, not `is not  or UCX`."""
    code, out, _ = run(capsys, "explain", "--arch", "LlamaForCausalLM", "--backend", "NIXL")
    assert code == 0
    assert 'env TRTLLM_NIXL_KVCACHE_BACKEND is not "" or UCX' in out
    assert "not  or" not in out


def test_counts_are_singular_or_plural(capsys):
    code, out, err = run(capsys, "lint", "tests/lint/fixtures/KVP040.toml")
    assert code == 1
    assert out.rstrip().endswith("Found 1 finding: 1 warning (1 file checked)") and "kvpolicy lint:" not in err  # one summary
    code, out, err = run(capsys, "lint", "tests/lint/fixtures/KVP040.toml", "--format", "github")
    assert code == 1
    assert "kvpolicy lint: 1 file, 1 finding, 0 suppressed" in err
    code, out, _ = run(capsys, "resolve", "--arch", "LlamaForCausalLM", "--backend", "UCX", "--runtime", "auto", "--kv-cache-manager", "auto")
    assert code == 1 and out.rstrip().endswith("\n1 error: this configuration cannot start")
    code, out, _ = run(capsys, "diff", "2026.09.02", "2026.09.10")
    assert "(s)" not in out and " way" in out.splitlines()[1]
