"""``kvpolicy check`` (lint + fmt --check + test --coverage, one exit code) and ``kvpolicy new``."""

from __future__ import annotations

import re
import shutil

import kvpolicy

from kvpolicy.lint import lint_paths
from kvpolicy.read.loader import shipped_root

from tests.support.constants import FIXTURES


def _shipped_copy(tmp_path):
    """The newest shipped version and its cases (what ``new`` copies from), in a folder of its own."""
    folder = tmp_path / "policies"
    folder.mkdir()
    newest = kvpolicy.load().version
    for path in shipped_root().glob(f"{newest}*.toml"):
        shutil.copy(path, folder / path.name)
    return folder


def test_check_passes_on_the_shipped_policies(cli):
    code, out, _ = cli("check", "policies")
    assert code == 0, out
    lines = out.splitlines()
    assert lines[-1] == "passed"
    assert [line.split()[:2] for line in lines[-4:-1]] == [["lint", "passed"], ["fmt", "passed"], ["test", "passed"]]


def test_check_reports_every_failing_step_in_one_summary(cli, tmp_path):
    folder = tmp_path / "policies"
    folder.mkdir()
    text = (FIXTURES / "KVP040.toml").read_text()
    (folder / "p.toml").write_text(text.replace("schema = 1\n", "schema   =   1\n", 1))
    (folder / "p.cases.toml").write_text('[[case]]\nname = "wrong"\ncontext = {}\nexpect = { backend = "UCX" }\n')
    code, out, _ = cli("check", str(folder))
    assert code == 1
    assert "KVP040" in out and "Would reformat" in out and "backend: expected UCX, got NIXL" in out
    assert out.splitlines()[-1] == "failed: lint, fmt, test"


def test_check_on_an_unusable_folder_exits_2(cli, tmp_path):
    assert cli("check", str(tmp_path / "missing"))[0] == 2
    code, out, _ = cli("check", str(tmp_path))
    assert code == 2 and "no policy files" in out


def test_new_scaffolds_the_next_version_and_its_cases(cli, tmp_path):
    folder = _shipped_copy(tmp_path)
    code, out, err = cli("new", "2027.01.01", "--dir", str(folder))
    assert code == 0, err
    created = folder / "2027.01.01.toml"
    assert 'version = "2027.01.01"' in created.read_text()
    newest = max(p.name[: -len(".cases.toml")] for p in folder.glob("*.cases.toml") if not p.name.startswith("2027"))
    previous_cases = (folder / f"{newest}.cases.toml").read_text()
    # The cases are copied; their header comment names the new file.
    assert (folder / "2027.01.01.cases.toml").read_text() == previous_cases.replace(
        f"cases for {newest}.toml", "cases for 2027.01.01.toml", 1
    )
    code, _, err = cli("new", "2027.01.01", "--dir", str(folder))
    assert code == 2 and "is not after the newest version" in err
    assert "is not a date" in cli("new", "2026.13.01", "--dir", str(folder))[2]
    assert "is not a version" in cli("new", "v2", "--dir", str(folder))[2]


def test_new_leaves_placeholders_that_check_refuses_until_filled(cli, tmp_path):
    """`new` copies the rules, never what the previous version says it is: summary, source and
    header comment are placeholders, which lint refuses (KVP042) with their lines; a copy that
    changes nothing (KVP052) and a source citing only the previous change (KVP053) are refused too."""
    folder = _shipped_copy(tmp_path)
    assert cli("new", "2027.01.01", "--dir", str(folder))[0] == 0
    created = folder / "2027.01.01.toml"
    text = created.read_text()
    previous = kvpolicy.load(folder).versions()[-2]
    previous = kvpolicy.load(folder, version=previous).policy
    cited = re.search(r"#\d+", previous.source).group(0)  # the upstream change the newest version mirrors
    assert previous.summary not in text and previous.source not in text
    assert f"as of {cited}" not in text  # the previous header comment (its rows still cite it: they are unchanged)
    assert text.startswith("#:schema ./policy.schema.json\n# TODO(kvpolicy new): ")
    policy = kvpolicy.load(folder, version="2027.01.01").policy
    assert policy.summary.startswith("TODO(kvpolicy new)") and policy.source.startswith("TODO(kvpolicy new)")

    code, out, _ = cli("check", str(folder))
    assert code == 1 and out.splitlines()[-1] == "failed: lint"
    found = re.findall(r"^(\S+):(\d+):\d+: (KVP\d{3}) ", out, re.MULTILINE)
    lines: dict[str, int] = {}  # the top-level summary and source: the first such lines
    for number, line in enumerate(text.splitlines(), 1):
        for key in ("summary", "source"):
            if line.startswith(key + " ="):
                lines.setdefault(key, number)
    assert sorted((int(line), code) for _, line, code in found) == [
        (2, "KVP042"), (4, "KVP052"), (lines["summary"], "KVP042"), (lines["source"], "KVP042")
    ]
    assert {path for path, _, _ in found} == {str(created)}
    assert "source is still the placeholder `kvpolicy new` wrote; name the upstream change" in out

    # Filled in, citing the same upstream change as the newest version and changing nothing: KVP052 and KVP053.
    filled = text.replace(
        'summary = "TODO(kvpolicy new): one line on what this version changes"', 'summary = "Llama4 prefers CPP."'
    ).replace(
        'source = "TODO(kvpolicy new): the upstream change this version mirrors (repository, PR, merge date, file)"',
        f'source = "NVIDIA/TensorRT-LLM {cited}"',
    )
    filled = "\n".join(line for line in filled.splitlines() if "TODO(kvpolicy new)" not in line) + "\n"
    created.write_text(filled)
    code, out, _ = cli("check", str(folder))
    assert code == 1
    assert sorted(set(re.findall(r": (KVP\d{3}) ", out))) == ["KVP052", "KVP053"]
    assert f"cites nothing new: it names only {cited}, which {previous.version} already cites" in out

    # A real change that cites a new upstream change passes.
    changed = filled.replace(
        f'source = "NVIDIA/TensorRT-LLM {cited}"', 'source = "NVIDIA/TensorRT-LLM #19999 (merged 2026-10-01)"'
    ).replace(
        '{ architecture = "Llama4ForConditionalGeneration", value = "PYTHON"',
        '{ architecture = "Llama4ForConditionalGeneration", value = "CPP"', 1,
    )
    assert "#19999" in changed and 'value = "CPP", reason = "Llama4' in changed
    created.write_text(changed)
    result = lint_paths([str(folder)])
    assert [f.code for f in result.findings if f.code in ("KVP042", "KVP052", "KVP053")] == []


def test_new_into_a_file_or_a_missing_folder_is_a_usage_error(cli, tmp_path):
    policy = tmp_path / "2026.09.10.toml"
    shutil.copy(shipped_root() / "2026.09.10.toml", policy)
    code, out, err = cli("new", "2027.01.01", "--dir", str(policy))
    assert code == 2 and out == ""
    assert err == f"kvpolicy: error: --dir {policy}: not a folder; name the policy folder that holds the versions (e.g. --dir {tmp_path})\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["2026.09.10.toml"]
    code, _, err = cli("new", "2027.01.01", "--dir", str(tmp_path / "missing"))
    assert code == 2 and f"--dir {tmp_path / 'missing'}: no such folder" in err and "Traceback" not in err


def test_check_claims_no_coverage_for_a_folder_without_a_valid_policy(cli, tmp_path):
    (tmp_path / "p.toml").write_text("schema = 1\n")
    code, out, _ = cli("check", str(tmp_path))
    assert code == 1
    test_line = next(line for line in out.splitlines() if line.startswith("  test "))
    assert "100.0%" not in test_line and "no coverage: no policy loaded, nothing to cover" in test_line
    assert "  lint  failed  1 file, " in out and "  fmt   " in out and " 1 error, " in test_line
    code, out, _ = cli("test", str(tmp_path), "--coverage")
    assert code == 1 and "TOTAL" not in out and "nothing to cover: no policy loaded" in out


def test_new_rewrites_summary_and_source_written_in_any_string_form():
    from kvpolicy.cli.author import _fresh_header, placeholders

    marks = placeholders()
    text = (
        "# the previous version's description\n\nschema = 1\nversion = \"2030.01.02\"\n"
        "summary = '''two\nlines'''\nsource = 'a \"literal\" string'\n\n[features.x]\nsource = \"a row's own\"\n"
    )
    fresh = _fresh_header(text, marks)
    assert fresh == (
        f"{marks['comment']}\nschema = 1\nversion = \"2030.01.02\"\nsummary = \"{marks['summary']}\"\n"
        f"source = \"{marks['source']}\"\n\n[features.x]\nsource = \"a row's own\"\n"
    )
    assert _fresh_header("schema = 1\nsummary = \"s\"\n", marks) is None  # no source line: refused, not guessed
