"""Write the generated pages of the documentation site (run by ``make docs`` before mkdocs):

- ``docs/reference/cli.md``: every command's ``--help``, from the CLI's own parser;
- ``docs/rules/index.md`` and ``docs/rules/KVPnnn.md``: one page per lint rule, from the rule
  catalogue (the page SARIF's ``helpUri`` points to).

The generated files are not kept in git (see ``.gitignore``): the parser and the catalogue are the
source.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

DOCS = Path(__file__).resolve().parent


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:  # argparse keeps sub-parsers only there
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _walk(parser: argparse.ArgumentParser, path: str):
    yield path, parser
    for name, child in _subcommands(parser).items():
        yield from _walk(child, f"{path} {name}")


def cli_reference() -> str:
    from kvpolicy.cli import build_parser

    parser = build_parser(None)
    out = [
        "# CLI reference",
        "",
        "Generated from the parser (`docs/generate.py`): what `kvpolicy COMMAND --help` prints.",
        "Exit codes: 0 pass, 1 findings or a configuration that cannot start, 2 bad input,",
        "3 the verdict depends on the model (see [How the model is found](../model-identity.md)).",
        "",
    ]
    for path, command in _walk(parser, "kvpolicy"):
        out += [f"## `{path}`", "", "```text", command.format_help().rstrip(), "```", ""]
    return "\n".join(out)


def _markdown(doc: str) -> str:
    """Rule docs are written with RST-style double backticks: Markdown takes single ones (the same
    conversion SARIF's help text gets)."""
    from kvpolicy.lint.report import markdown

    return markdown(doc)


def rule_pages() -> dict[str, str]:
    from kvpolicy.lint import RULES

    pages = {}
    rows = ["# Lint rules", "", "Every rule of `kvpolicy lint`, from its catalogue. Select or ignore them",
            "with `--select` / `--ignore` (codes, prefixes, names or categories).", "",
            "| code | name | category | severity | what it reports |", "|---|---|---|---|---|"]
    for code, rule in sorted(RULES.items()):
        rows.append(f"| [{code}]({code}.md) | `{rule.name}` | {rule.category} | {rule.severity} | {_markdown(rule.summary)} |")
        pages[f"{code}.md"] = "\n".join([
            f"# {code} `{rule.name}`",
            "",
            f"**Category** {rule.category} · **severity** {rule.severity} · **checks** {rule.kind}",
            "",
            _markdown(rule.summary) + ".",
            "",
            _markdown(rule.doc).replace("\n## ", "\n## ").strip(),
            "",
        ])
    pages["index.md"] = "\n".join(rows) + "\n"
    return pages


def main() -> int:
    import os

    os.environ["COLUMNS"] = "100"  # argparse wraps help to the terminal: the pages do not depend on it
    # mkdocstrings finds packages by folder name; the package kvpolicy is the folder engine/.
    shim = DOCS.parent / "build" / "api-source"
    shim.mkdir(parents=True, exist_ok=True)
    link = shim / "kvpolicy"
    if not link.is_symlink():
        link.symlink_to(DOCS.parent / "engine", target_is_directory=True)
    (DOCS / "reference").mkdir(exist_ok=True)
    (DOCS / "reference" / "cli.md").write_text(cli_reference())
    rules = DOCS / "rules"
    rules.mkdir(exist_ok=True)
    for stale in rules.glob("*.md"):
        stale.unlink()
    for name, text in rule_pages().items():
        (rules / name).write_text(text)
    print(f"docs: wrote reference/cli.md and {len(list(rules.glob('*.md')))} rule pages", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
