"""Policy linting for CI: a catalogue of rules with stable codes, five output formats,
suppressions, policy tests as data with coverage, and a canonical formatter.

    >>> from kvpolicy.lint import lint_paths
    >>> result = lint_paths(["policies/"])
    >>> [f"{f.location}: {f.code}" for f in result.findings]
    []

Rules live in :mod:`kvpolicy.lint.rules` (``kvpolicy rules`` lists them); the exact analysis
behind the precedence and safety rules in :mod:`kvpolicy.lint.precedence`.
"""

from .rules import CATEGORIES, RULES, Finding, LintRule
from .runner import LintConfig, LintResult, LintUsageError, find_config, lint_paths

__all__ = [
    "CATEGORIES",
    "RULES",
    "Finding",
    "LintConfig",
    "LintResult",
    "LintRule",
    "LintUsageError",
    "find_config",
    "lint_paths",
]
