"""Fixtures for the report tests: run the CLI in-process, parse what it wrote."""

from __future__ import annotations

import io
import json
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import pytest

from kvpolicy.cli import main
from kvpolicy.read.model import as_json
from tests.report.page import Node, parse

REPO = Path(__file__).resolve().parents[2]
#: The last upstream flip with the example configs: the page the issue asked for.
FLIP = ("--from", "2026.08.11", "--to", "2026.08.24", "--configs", "examples/configs",
        "--arch-map", "examples/configs/arch-map.yaml")
#: The same page with the configs named by absolute paths, as a CI job or a reviewer's shell often
#: names them: the paths the page shows must not widen it.
FLIP_ABSOLUTE = ("--from", "2026.08.11", "--to", "2026.08.24", "--configs", str(REPO / "examples/configs"),
                 "--arch-map", str(REPO / "examples/configs/arch-map.yaml"))


@pytest.fixture(scope="session", autouse=True)
def _diff_once_per_pair():
    """Compute each pair's diff once per session for the report tests.

    ``report`` and ``diff --format json`` both call ``diff_policies``, a pure function of the two
    policies; these tests check that the page shows what ``diff`` prints, not ``diff_policies``
    itself (``tests/analyse`` does), so a pair's result is shared. Keyed by the policies' full
    content: a fixture folder that reuses a version name is a different key.
    """
    import kvpolicy.cli.diff
    import kvpolicy.report.page
    from kvpolicy.analyse.diff import diff_policies

    results = {}

    def content(policy_set) -> str:
        policy = getattr(policy_set, "policy", policy_set)
        return as_json(policy)

    def once(old, new):
        key = (content(old), content(new))
        if key not in results:
            results[key] = diff_policies(old, new)
        return results[key]

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(kvpolicy.report.page, "diff_policies", once)
        patch.setattr(kvpolicy.cli.diff, "diff_policies", once)
        yield


@pytest.fixture(autouse=True)
def _in_repo(monkeypatch):
    # Policy locations and config paths print relative to the working directory.
    monkeypatch.chdir(REPO)


@pytest.fixture
def report(tmp_path, capsys):
    """``report(*argv) -> (exit code, page text, parsed page)``; ``-o`` is added."""

    def run(*argv: str) -> tuple[int, str, Node | None]:
        out = tmp_path / "report.html"
        if out.exists():
            out.unlink()
        code = main(["report", *argv, "-o", str(out)])
        capsys.readouterr()
        if not out.exists():
            return code, "", None
        text = out.read_text(encoding="utf-8")
        return code, text, parse(text)

    return run


@pytest.fixture(scope="session")
def shared_report(tmp_path_factory):
    """``shared_report(*argv)``: like ``report``, but each distinct argv is rendered once per session.

    Several tests read the same page (a pair's diff, the whole history); each page costs a diff of
    seconds. Pages are parsed read-only by the tests, so sharing them changes nothing they check.
    """
    pages: dict[tuple[str, ...], tuple[int, str, Node | None]] = {}
    folder = tmp_path_factory.mktemp("shared-report")

    def run(*argv: str) -> tuple[int, str, Node | None]:
        if argv not in pages:
            out = folder / f"report-{len(pages)}.html"
            quiet = io.StringIO()
            with pytest.MonkeyPatch.context() as patch, redirect_stdout(quiet), redirect_stderr(quiet):
                patch.chdir(REPO)
                code = main(["report", *argv, "-o", str(out)])
            text = out.read_text(encoding="utf-8") if out.exists() else ""
            pages[argv] = (code, text, parse(text) if text else None)
        return pages[argv]

    run.folder = folder  # where the pages are written: relative links start here
    return run


@pytest.fixture(scope="session")
def shared_json():
    """``shared_json(*argv)``: another command's JSON, each distinct argv run once per session."""
    outputs: dict[tuple[str, ...], object] = {}

    def run(*argv: str):
        if argv not in outputs:
            buffer = io.StringIO()
            with pytest.MonkeyPatch.context() as patch, redirect_stdout(buffer), redirect_stderr(io.StringIO()):
                patch.chdir(REPO)
                main(list(argv))
            outputs[argv] = json.loads(buffer.getvalue())
        return outputs[argv]

    return run


@pytest.fixture
def cli_json(capsys):
    """``cli_json(*argv)``: the JSON another kvpolicy command prints."""

    def run(*argv: str):
        main(list(argv))
        return json.loads(capsys.readouterr().out)

    return run
