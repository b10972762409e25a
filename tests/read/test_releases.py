"""TensorRT-LLM releases -> policy versions: the shipped table, tag spelling, the installed release
found without importing it, and the CLI's --trtllm and release tags in --from/--to."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

import kvpolicy
from kvpolicy.cli import main
from kvpolicy.cli.policies import load_policy_argument
from kvpolicy.errors import PolicyError
from kvpolicy.read.policyfile import policy_files, shipped_root
from kvpolicy.read.releases import (
    CERTAINTIES,
    RELEASES_FILE,
    ReleaseError,
    installed_trtllm,
    normalise_tag,
    policy_version_for,
    release,
    releases,
)

from tests.support import golden

from tests.support import upstream
from tests.support.constants import REPO, VERSIONS



def run(capsys, *argv: str) -> tuple[int, str, str]:
    try:
        code = main(list(argv))
    except SystemExit as exc:  # argparse's usage errors
        code = int(exc.code)
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture(autouse=True)
def _in_repo(monkeypatch):
    monkeypatch.chdir(REPO)


def fake_trtllm(folder: Path, version: str, name: str | None = None) -> Path:
    """A ``tensorrt_llm`` dist-info as pip leaves it, in ``folder``."""
    info = folder / (name or f"tensorrt_llm-{version}.dist-info")
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: tensorrt_llm\nVersion: {version}\n\nlong description\nVersion: 0\n")
    return info


# -- the table -------------------------------------------------------------------------------------


def test_table_parses_with_every_field():
    rows = releases()
    assert [row.tag for row in rows][:2] == ["v1.3.0rc20", "v1.3.0rc21"]
    assert len({row.tag for row in rows}) == len(rows) == 14
    # Every tag from v1.3.0rc22 to the newest upstream's records show (v1.4.0rc4): rc0 of 1.4 was never published.
    assert [row.tag for row in rows][2:] == [f"v1.3.0rc{n}" for n in range(22, 30)] + [f"v1.4.0rc{n}" for n in range(1, 5)]
    for row in rows:
        assert normalise_tag(row.tag) == row.tag
        assert row.certainty in CERTAINTIES
        assert row.source and row.note and row.date
        assert row.location.path.endswith("releases.toml") and row.location.line > 1


def test_every_policy_version_it_names_ships():
    named = {row.policy_version for row in releases() if row.policy_version is not None}
    assert named <= set(VERSIONS), named - set(VERSIONS)
    closest = {row.closest for row in releases() if row.closest is not None}
    assert closest <= set(VERSIONS), closest - set(VERSIONS)
    assert all(row.closest is None for row in releases() if row.policy_version is not None)


def test_rc27_predates_19004_and_rc28_holds_it():
    # rc27's tag commit (09-14) predates #19004 (merged 09-15): a version with Llama's V2 default is wrong there.
    rc27 = policy_version_for("v1.3.0rc27").policy_version
    assert upstream.VERSION_STATE[rc27] < "2026-09-15"
    assert kvpolicy.load(version=rc27).resolve(architecture="LlamaForCausalLM", backend="NIXL").kv_cache_manager == "V1"
    rc28 = policy_version_for("v1.3.0rc28").policy_version
    assert kvpolicy.load(version=rc28).resolve(architecture="LlamaForCausalLM", backend="NIXL").kv_cache_manager == "V2"
    # v1.4.0rc1's note blames #17495 for the defaults and #15780 not at all: the bounce fields predate it.
    rc1 = release("v1.4.0rc1")
    assert "#17495" in rc1.note and "agent_bounce" not in rc1.note


def test_later_releases_never_map_to_earlier_policies():
    mapped = [row.policy_version for row in releases() if row.policy_version is not None]
    assert mapped == sorted(mapped, key=lambda v: tuple(map(int, v.split("."))))


def test_a_release_holds_only_merges_before_its_date():
    """Where the date is known (tag page, bump PR), the policy version's upstream merge date
    (tests/support/upstream.py's VERSION_STATE) is not after it; releases without a policy version
    were cut before #16164 or are the 1.4 line kvpolicy does not model."""
    first = upstream.VERSION_STATE[VERSIONS[0]]
    for row in releases():
        day = re.match(r"~?(\d{4})-(\d{2})-(\d{2})(?:\.\.(?:(\d{2})-)?(\d{2}))?", row.date)
        latest = None
        if day:  # a range's last day: the cut may be as late as that
            year, month, first_day, end_month, end_day = day.groups()
            latest = f"{year}-{end_month or month}-{end_day or first_day}"
        if row.policy_version is None:
            assert row.tag.startswith("v1.4.") or (latest and latest < first), row
        elif latest:
            assert upstream.VERSION_STATE[row.policy_version] <= latest, row


def test_the_table_ships_with_the_package_not_among_the_policies():
    assert RELEASES_FILE.parent == Path(sys.modules["kvpolicy.read"].__file__).parent  # beside its reader
    # Not in the policy folder: load, lint, fmt and test read every *.toml there as a policy.
    assert RELEASES_FILE.parent != shipped_root()
    assert all(path.name != "releases.toml" for path in policy_files(shipped_root()))
    try:
        import tomllib
    except ImportError:  # Python 3.10
        import tomli as tomllib
    data = tomllib.loads((REPO / "pyproject.toml").read_text())
    assert "*.toml" in data["tool"]["setuptools"]["package-data"]["kvpolicy.read"]


@pytest.mark.parametrize(
    ("text", "problem", "line"),
    [
        ('schema = 1\n[[release]]\ntag = "v1.3.0rc1"\n', "`date` must be a non-empty string", 2),
        ('schema = 1\n[[release]]\ntag = "v1.3.0rc1"\ndate = "2026-01-01"\ncertainty = "sure"\nsource = "s"\nnote = "n"\n',
         "`certainty` 'sure'", 2),
        ('schema = 1\n[[release]]\ntag = "1.3.0.rc1"\ndate = "2026-01-01"\ncertainty = "low"\nsource = "s"\nnote = "n"\n',
         "write 'v1.3.0rc1'", 2),
        ('schema = 1\n\n[[release]]\ntag = "v1.3.0rc1"\ndate = "2026-01-01"\ncertainty = "low"\nsource = "s"\nnote = "n"\n'
         'policy_version = "latest"\nurl = "x"\n', "unknown key(s) url", 3),
        ('schema = 1\n[[release]]\ntag = "v1.3.0rc1"\ndate = "2026-01-01"\ncertainty = "low"\nsource = "s"\nnote = "n"\n'
         '[[release]]\ntag = "v1.3.0rc1"\ndate = "2026-01-01"\ncertainty = "low"\nsource = "s"\nnote = "n"\n', "listed twice", 8),
        ('schema = 1\n[[release]]\ntag = "v1.3.0rc1\n', "toml", 3),
        ("schema = 2\nrelease = []\n", "no [[release]] rows", 1),
    ],
)
def test_a_broken_table_is_a_located_error(tmp_path, text, problem, line):
    path = tmp_path / "releases.toml"
    path.write_text(text)
    with pytest.raises(PolicyError) as caught:
        releases(path)
    found = [p for p in caught.value.problems if problem in str(p)]
    assert found, caught.value
    assert found[0].location.line == line


def test_a_table_is_read_with_a_cap(tmp_path):
    path = tmp_path / "releases.toml"
    path.write_bytes(b"#" * (2 << 20))
    with pytest.raises(PolicyError, match="limited to"):
        releases(path)


# -- tags ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "tag"),
    [
        ("v1.3.0rc25", "v1.3.0rc25"),
        ("1.3.0rc25", "v1.3.0rc25"),
        ("1.3.0.rc25", "v1.3.0rc25"),
        ("1.3.0-rc25", "v1.3.0rc25"),
        ("V1.3.0RC25", "v1.3.0rc25"),
        (" 1.3.0rc025 ", "v1.3.0rc25"),
        ("1.4.0", "v1.4.0"),
        ("2026.08.18", None),  # a policy version id
        ("1.3.0rc25+cu129", None),  # a local build
        ("1.3.0rc26.dev20260901", None),
        ("1.3", None),
    ],
)
def test_tags_normalise(text, tag):
    assert normalise_tag(text) == tag


def test_policy_version_for_every_spelling():
    assert policy_version_for("v1.3.0rc25").policy_version == "2026.08.18"
    assert policy_version_for("1.3.0.rc25") == policy_version_for("1.3.0rc25")
    assert policy_version_for("1.3.0rc26").policy_version == "2026.09.02"


def test_unknown_release_lists_the_known_ones_and_the_way_out():
    with pytest.raises(ReleaseError) as caught:
        release("v9.0.0")
    message = str(caught.value)
    assert "v1.3.0rc20" in message and "v1.4.0rc1" in message and "--version" in message
    assert caught.value.release is None
    with pytest.raises(ReleaseError, match="local build"):
        release("1.3.0rc25+cu129")


@pytest.mark.parametrize(("tag", "why"), [("v1.3.0rc20", "transceiver_runtime"), ("v1.3.0rc21", "#16164"), ("v1.4.0rc2", "after v1.4.0rc1")])
def test_a_release_no_policy_models_is_refused_with_its_note(tag, why):
    with pytest.raises(ReleaseError, match=re.escape(why)) as caught:
        policy_version_for(tag)
    assert caught.value.release is not None and caught.value.release.tag == tag


# -- the installed TensorRT-LLM --------------------------------------------------------------------


def test_installed_trtllm_from_a_dist_info_on_sys_path(tmp_path, monkeypatch):
    assert installed_trtllm([str(tmp_path)]) is None
    fake_trtllm(tmp_path / "site", "1.3.0rc26")
    monkeypatch.setattr(sys, "path", [str(tmp_path / "missing"), str(tmp_path / "site"), *sys.path])
    assert installed_trtllm() == "1.3.0rc26"
    assert "tensorrt_llm" not in sys.modules


def test_installed_trtllm_metadata_forms(tmp_path):
    # A source checkout's egg-info: the version only inside.
    egg = tmp_path / "a" / "tensorrt_llm.egg-info"
    egg.mkdir(parents=True)
    (egg / "PKG-INFO").write_text("Metadata-Version: 2.1\nName: tensorrt-llm\nVersion: 1.3.0rc27\n")
    assert installed_trtllm([str(tmp_path / "a")]) == "1.3.0rc27"
    # An old egg-info that is a file; a dist-info without METADATA (the folder name says it).
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "tensorrt_llm-1.3.0rc22-py3.12.egg-info").write_text("Name: tensorrt_llm\nVersion: 1.3.0rc22\n")
    assert installed_trtllm([str(tmp_path / "b")]) == "1.3.0rc22"
    (tmp_path / "c" / "TensorRT-LLM-1.3.0rc24.dist-info").mkdir(parents=True)
    assert installed_trtllm([str(tmp_path / "c")]) == "1.3.0rc24"
    # Other distributions are not it.
    fake_trtllm(tmp_path / "d", "9.9", name="tensorrt_llm_extras-9.9.dist-info")
    assert installed_trtllm([str(tmp_path / "d"), str(tmp_path / "c")]) == "1.3.0rc24"


def test_resolve_defaults_to_the_installed_release(capsys, tmp_path, monkeypatch):
    fake_trtllm(tmp_path, "1.3.0rc26")
    monkeypatch.setattr(sys, "path", [str(tmp_path), *sys.path])
    code, out, _ = run(capsys, "resolve", "--arch", "LlamaForCausalLM", "--backend", "NIXL")
    assert code == 0
    assert "TensorRT-LLM 1.3.0rc26 installed: policy 2026.09.02" in out
    assert "\npolicy 2026.09.02 (sha256" in out
    code, out, _ = run(capsys, "explain", "--arch", "LlamaForCausalLM", "--backend", "NIXL", "--format", "json")
    data = json.loads(out)
    assert data["policy_version"] == "2026.09.02"
    assert data["trtllm"]["installed"] is True and data["trtllm"]["release"]["tag"] == "v1.3.0rc26"
    # An explicit version wins, and nothing is said about the installed release.
    code, out, _ = run(capsys, "resolve", "--arch", "LlamaForCausalLM", "--backend", "NIXL", "--version", "2026.08.11")
    assert code == 0 and "\npolicy 2026.08.11 (sha256" in out and "TensorRT-LLM" not in out


def test_an_installed_release_no_version_models_exits_4_with_the_ways_forward(capsys, tmp_path, monkeypatch):
    # Never answered with another version silently: neither 0 (starts) nor 1 (cannot start).
    fake_trtllm(tmp_path, "9.0.0")
    monkeypatch.setattr(sys, "path", [str(tmp_path), *sys.path])
    code, out, err = run(capsys, "resolve", "--arch", "LlamaForCausalLM", "--backend", "NIXL")
    assert code == 4 and out == ""
    assert "TensorRT-LLM 9.0.0 installed: TensorRT-LLM v9.0.0 is newer than every release kvpolicy models" in err
    assert f"the closest is policy {VERSIONS[-1]}" in err
    assert "--accept-unmodelled" in err and "--version V" in err and "kvpolicy new" in err
    # The risk accepted explicitly: the closest version answers, and the output says so first.
    code, out, err = run(capsys, "resolve", "--arch", "LlamaForCausalLM", "--backend", "NIXL", "--accept-unmodelled")
    assert code == 0, err
    assert "warning: TensorRT-LLM 9.0.0 is not modelled; answering with policy" in out
    assert f"\npolicy {VERSIONS[-1]} (sha256" in out
    code, out, _ = run(capsys, "resolve", "--arch", "LlamaForCausalLM", "--backend", "NIXL", "--accept-unmodelled", "--format", "json")
    data = json.loads(out)
    assert data["trtllm"]["installed"] is True and "not modelled" in data["trtllm"]["warning"]
    # An explicit version is the user's own choice: it answers, whatever is installed.
    code, out, _ = run(capsys, "resolve", "--arch", "LlamaForCausalLM", "--backend", "NIXL", "--version", "2026.08.11")
    assert code == 0 and "TensorRT-LLM" not in out


def test_an_installed_release_with_nothing_close_cannot_be_accepted(capsys, tmp_path, monkeypatch):
    fake_trtllm(tmp_path, "1.3.0rc20")  # before transceiver_runtime existed
    monkeypatch.setattr(sys, "path", [str(tmp_path), *sys.path])
    for extra in ((), ("--accept-unmodelled",)):
        code, out, err = run(capsys, "resolve", "--arch", "LlamaForCausalLM", *extra)
        assert code == 4 and out == ""
        assert "no policy version comes close" in err and "--accept-unmodelled" not in err


def test_an_installed_release_missing_from_the_chosen_folder_exits_4(capsys, tmp_path, monkeypatch):
    fake_trtllm(tmp_path / "site", "1.3.0rc25")
    monkeypatch.setattr(sys, "path", [str(tmp_path / "site"), *sys.path])
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / f"{VERSIONS[-1]}.toml").write_bytes((shipped_root() / f"{VERSIONS[-1]}.toml").read_bytes())
    argv = ("resolve", "--policy", str(tmp_path / "mine"), "--arch", "LlamaForCausalLM", "--backend", "NIXL")
    code, out, err = run(capsys, *argv)
    assert code == 4 and out == ""
    assert "is policy 2026.08.18, but the policies in" in err and f"the closest is their newest, {VERSIONS[-1]}" in err
    code, out, _ = run(capsys, *argv, "--accept-unmodelled")
    assert code == 0 and f"answering with {VERSIONS[-1]}" in out


def test_the_api_chooses_as_the_cli_does(tmp_path, monkeypatch):
    import warnings

    import kvpolicy
    from kvpolicy.read.releases import UnmodelledRelease

    assert kvpolicy.load().version == VERSIONS[-1]  # nothing installed: the newest
    assert kvpolicy.load(release="v1.3.0rc26").version == policy_version_for("v1.3.0rc26").policy_version
    fake_trtllm(tmp_path, "1.3.0rc26")
    monkeypatch.setattr(sys, "path", [str(tmp_path), *sys.path])
    assert kvpolicy.load().version == policy_version_for("v1.3.0rc26").policy_version
    assert kvpolicy.load(version="2026.08.11").version == "2026.08.11"
    assert kvpolicy.load(shipped_root()).version == VERSIONS[-1]  # a folder named: its newest, as documented
    with pytest.raises(ValueError, match="give one of them"):
        kvpolicy.load(version="2026.08.11", release="v1.3.0rc26")
    fake_trtllm(tmp_path / "newer", "9.0.0")
    monkeypatch.setattr(sys, "path", [str(tmp_path / "newer"), *sys.path])
    with pytest.raises(UnmodelledRelease) as caught:
        kvpolicy.load()
    assert caught.value.closest == VERSIONS[-1] and "newer than every release" in str(caught.value)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        assert kvpolicy.load(accept_unmodelled=True).version == VERSIONS[-1]
    assert any("not modelled" in str(w.message) for w in seen)


# -- the CLI ---------------------------------------------------------------------------------------


def test_resolve_trtllm_picks_the_release_policy(capsys):
    code, out, err = run(capsys, "resolve", "--trtllm", "v1.3.0rc25", "--arch", "LlamaForCausalLM", "--backend", "NIXL")
    assert code == 0, err
    assert "TensorRT-LLM v1.3.0rc25: policy 2026.08.18 (medium certainty" in out
    assert "\npolicy 2026.08.18 (sha256" in out
    code, out, _ = run(capsys, "resolve", "--trtllm", "1.3.0.rc25", "--arch", "LlamaForCausalLM", "--backend", "NIXL", "--format", "json")
    data = json.loads(out)
    assert data["policy_version"] == "2026.08.18"
    assert data["trtllm"] == {"given": "1.3.0.rc25", "installed": False, "release": policy_version_for("v1.3.0rc25").to_dict()}


@pytest.mark.parametrize(
    ("argv", "reason"),
    [
        (["--trtllm", "v1.2.0"], "not in kvpolicy's release table; known releases: v1.3.0rc20"),
        (["--trtllm", "banana"], "is not a TensorRT-LLM release version"),
        (["--trtllm", "v1.3.0rc25", "--version", "2026.08.18"], "--trtllm and --version both pick"),
    ],
)
def test_resolve_trtllm_refusals_exit_2_with_the_reason(capsys, argv, reason):
    code, out, err = run(capsys, "resolve", "--arch", "LlamaForCausalLM", *argv)
    assert code == 2 and out == ""
    assert reason in err


@pytest.mark.parametrize(
    ("release_tag", "reason"),
    [
        ("v9.0.0", "newer than every release kvpolicy models"),
        ("1.3.0rc20", "no transceiver_runtime field yet"),
    ],
)
def test_resolve_trtllm_unmodelled_exits_4_with_the_reason(capsys, release_tag, reason):
    code, out, err = run(capsys, "resolve", "--arch", "LlamaForCausalLM", "--trtllm", release_tag)
    assert code == 4 and out == ""
    assert reason in err


def test_resolve_trtllm_when_the_folder_lacks_its_version(capsys, tmp_path):
    (tmp_path / f"{VERSIONS[-1]}.toml").write_bytes((shipped_root() / f"{VERSIONS[-1]}.toml").read_bytes())
    code, _, err = run(capsys, "resolve", "--policy", str(tmp_path), "--trtllm", "v1.3.0rc25", "--arch", "LlamaForCausalLM")
    assert code == 4
    assert "is policy 2026.08.18, but the policies in" in err and "hold no such version" in err


def test_impact_takes_release_tags_and_trtllm_for_to(capsys):
    code, out, err = run(
        capsys, "impact", "--configs", "examples/configs", "--from", "v1.3.0rc24", "--trtllm", "1.3.0rc25",
        "--format", "json", "--fail-on", "never",
    )
    assert code == 0, err
    data = json.loads(out)
    assert (data["from"], data["to"]) == ("2026.08.07", "2026.08.18")
    code, out, _ = run(capsys, "impact", "--configs", "examples/configs", "--from", "v1.3.0rc24", "--to", "v1.3.0rc26", "--fail-on", "never")
    assert code == 0
    assert "--to v1.3.0rc26: TensorRT-LLM v1.3.0rc26 is policy 2026.09.02" in out
    assert "kvpolicy impact 2026.08.07 -> 2026.09.02" in out
    code, _, err = run(capsys, "impact", "--configs", "examples/configs", "--from", "v9.0.0", "--to", "2026.09.10")
    assert code == 4 and "--from v9.0.0: TensorRT-LLM v9.0.0 is newer than every release" in err
    code, out, err = run(capsys, "impact", "--configs", "examples/configs", "--from", "2026.09.02", "--to", "v9.0.0",
                         "--accept-unmodelled", "--fail-on", "never")
    assert code == 0, err
    assert "warning: --to v9.0.0: not modelled, answered with policy" in out
    code, _, err = run(capsys, "impact", "--configs", "examples/configs", "--from", "v1.3.0rc24", "--to", "2026.09.10", "--trtllm", "v1.3.0rc25")
    assert code == 2 and "not allowed with" in err


def test_report_names_versions_by_release(capsys, tmp_path):
    assert load_policy_argument("v1.3.0rc22").version == "2026.07.21"
    assert load_policy_argument("2026.07.21").version == "2026.07.21"
    code, _, err = run(capsys, "report", "--to", "2026.09.10", "--trtllm", "v1.3.0rc25", "-o", str(tmp_path / "r.html"))
    assert code == 2 and "not allowed with" in err
    code, _, err = run(capsys, "report", "--trtllm", "v1.3.0rc21", "-o", str(tmp_path / "r.html"))
    assert code == 4 and "--trtllm v1.3.0rc21: no policy version models TensorRT-LLM v1.3.0rc21" in err


def test_releases_command(capsys, tmp_path, monkeypatch):
    code, out, _ = run(capsys, "releases")
    assert code == 0
    golden.check_golden(Path(__file__).parent / "golden" / "releases.txt", out)
    assert re.search(r"v1\.3\.0rc25\s+~2026-08-27\s+2026\.08\.18\s+medium\n", out)
    assert re.search(r"v1\.4\.0rc1\s+2026-10-22 01:38\s+2026\.10\.22\s+medium\n", out)
    assert re.search(r"v1\.4\.0rc4\s+unknown\s+none \(closest 2026\.10\.22\)\s+medium\n", out)
    fake_trtllm(tmp_path, "1.3.0rc26")
    monkeypatch.setattr(sys, "path", [str(tmp_path), *sys.path])
    code, out, _ = run(capsys, "releases", "--format", "json")
    data = json.loads(out)
    assert code == 0 and data["installed"] == "1.3.0rc26"
    assert [r["tag"] for r in data["releases"] if r["installed"]] == ["v1.3.0rc26"]
    assert {"tag", "date", "policy_version", "certainty", "source", "note"} <= set(data["releases"][0])
