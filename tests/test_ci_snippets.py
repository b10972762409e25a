"""The CI snippets the README and the docs tell users to paste run, against the commit they pin.

The snippets pin kvpolicy to a commit (``rev:`` for pre-commit, ``@SHA`` for pip). A pin that lags
behind the snippet's own commands breaks when pasted (an old build wrote ``-o sarif=FILE`` into a file
literally named ``sarif=FILE``). This test reads every pin, checks they agree, takes that commit's
code out of this repository's history (``git archive``, as pip would build it: ``engine/`` is the
package, ``transports/`` and ``policies/`` its subpackages), and runs the workflow's commands with it
in a scratch repository holding that commit's policies: lint with GitHub annotations and a SARIF file
against a base ref, then fmt --check and the policy tests at 100% coverage. The hook ids the
pre-commit snippet names must be in that commit's ``.pre-commit-hooks.yaml``.
"""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PAGES = [REPO / "README.md", REPO / "docs" / "ci.md", REPO / "docs" / "report.md"]
PIN = re.compile(r"(?:rev: |kvpolicy@)([0-9a-f]{7,40})\b")


def _pins() -> dict[str, set[str]]:
    return {page.relative_to(REPO).as_posix(): set(PIN.findall(page.read_text(encoding="utf-8"))) for page in PAGES}


def _git(*args: str, cwd: Path = REPO, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(["git", *args], cwd=cwd, capture_output=True, timeout=120, **kwargs)


def test_every_page_pins_the_same_commit():
    pins = _pins()
    assert all(pins.values()), pins
    assert len(set().union(*pins.values())) == 1, f"the snippets pin different commits: {pins}"


@pytest.fixture(scope="module")
def pinned(tmp_path_factory) -> tuple[str, Path]:
    (sha,) = set().union(*_pins().values())
    if _git("rev-parse", "--git-dir").returncode != 0:
        pytest.skip("not a git checkout: the pinned commit cannot be taken out of the history")
    if _git("cat-file", "-e", f"{sha}^{{commit}}").returncode != 0:
        pytest.fail(f"the snippets pin {sha}, which this repository's history does not hold")
    archive = _git("archive", "--format=tar", sha, "engine", "transports", "policies", ".pre-commit-hooks.yaml")
    assert archive.returncode == 0, archive.stderr.decode()
    tree = tmp_path_factory.mktemp("pinned")
    with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
        tar.extractall(tree / "src", filter="data")
    site = tree / "site"
    # The package as pyproject.toml's package-dir maps it: kvpolicy <- engine/, and its subpackages.
    shutil.copytree(tree / "src" / "engine", site / "kvpolicy")
    shutil.copytree(tree / "src" / "transports", site / "kvpolicy" / "transports")
    shutil.copytree(tree / "src" / "policies", site / "kvpolicy" / "policies")
    return sha, tree


def _kvpolicy(tree: Path, cwd: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(tree / "site"), "KVPOLICY_CACHE_DIR": str(tree / "cache"), "NO_COLOR": "1"}
    return subprocess.run([sys.executable, "-m", "kvpolicy", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


def test_the_pinned_commit_runs_the_workflow_as_pasted(pinned, tmp_path):
    sha, tree = pinned
    repo = tmp_path / "scratch"
    shutil.copytree(tree / "src" / "policies", repo / "policies")
    (repo / "policies" / "policy.schema.json").unlink(missing_ok=True)
    for file in (repo / "policies").glob("__init__.py"):
        file.unlink()
    # A pull request: the base commit, then one more commit on top (`--base` compares with it).
    for command in (("init", "-q"), ("add", "-A"), ("-c", "user.name=ci", "-c", "user.email=ci@example.invalid", "commit", "-qm", "base")):
        assert _git(*command, cwd=repo).returncode == 0
    lint = _kvpolicy(tree, repo, "lint", "policies/", "--format", "github", "-o", "sarif=kvpolicy.sarif", "--base", "HEAD")
    assert lint.returncode == 0, f"kvpolicy@{sha[:12]} lint failed as pasted:\n{lint.stdout}\n{lint.stderr}"
    assert not (repo / "sarif=kvpolicy.sarif").exists(), "the pinned build does not know -o FORMAT=FILE"
    sarif = json.loads((repo / "kvpolicy.sarif").read_text())
    assert sarif["version"] == "2.1.0" and sarif["runs"][0]["tool"]["driver"]["name"] == "kvpolicy"
    assert all(line.startswith("::") for line in lint.stdout.splitlines() if line.strip())  # annotations only
    for args in (("fmt", "--check", "policies/"), ("test", "--coverage", "--threshold", "100", "policies/")):
        done = _kvpolicy(tree, repo, *args)
        assert done.returncode == 0, f"kvpolicy@{sha[:12]} {' '.join(args)}:\n{done.stdout}\n{done.stderr}"


def test_the_hook_ids_the_snippet_names_exist_at_the_pinned_commit(pinned):
    _, tree = pinned
    named = set(re.findall(r"- id: (kvpolicy-[a-z]+)", (REPO / "README.md").read_text(encoding="utf-8")))
    hooks = set(re.findall(r"^- id: (\S+)", (tree / "src" / ".pre-commit-hooks.yaml").read_text(), re.MULTILINE))
    assert named and named <= hooks, named - hooks
