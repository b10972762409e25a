"""Every lint rule's SARIF ``helpUri`` is the page the documentation site generates for it."""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

from kvpolicy.lint import RULES, lint_paths
from kvpolicy.lint.report import DOCS_URL, render

ROOT = Path(__file__).resolve().parents[2]


def _generator():
    spec = importlib.util.spec_from_file_location("docs_generate", ROOT / "docs" / "generate.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_rules_help_uri_is_its_generated_page_on_the_site_mkdocs_builds():
    site_url = re.search(r"^site_url:\s*(\S+)", (ROOT / "mkdocs.yml").read_text(), re.MULTILINE)
    assert site_url and site_url.group(1) == DOCS_URL, "mkdocs.yml's site_url is where helpUri points"
    pages = _generator().rule_pages()
    sarif = json.loads(render(lint_paths([str(Path(__file__).parent / "fixtures" / "clean.toml")], cache=False), "sarif"))
    rules = sarif["runs"][0]["tool"]["driver"]["rules"]
    assert [rule["id"] for rule in rules] == list(RULES)
    for rule in rules:
        code = rule["id"]
        assert rule["helpUri"] == f"{DOCS_URL}rules/{code}/"  # mkdocs' directory URL of rules/{code}.md
        assert f"{code}.md" in pages and f"# {code}" in pages[f"{code}.md"]
