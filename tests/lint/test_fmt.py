"""``kvpolicy fmt``: canonical output (golden), comments kept, data unchanged, idempotent."""

from __future__ import annotations

import shutil
import sys

import pytest
from hypothesis import HealthCheck, given, settings
from kvpolicy.lint.fmt import FormatError, format_text
from kvpolicy.read.loader import shipped_root

from tests.support.strategies import policies

from .conftest import FIXTURES, check_golden

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

MESSY = FIXTURES / "fmt" / "messy.toml"


def _data(text: str):
    """TOML data with preference rows in canonical order (the one change fmt makes to data)."""

    def sort(node):
        if isinstance(node, dict):
            return {
                k: sorted((sort(v) for v in value), key=lambda r: (r.get("architecture", ""), r.get("model_type", "")))
                if k == "rows" and isinstance(value, list) and all(isinstance(v, dict) for v in value)
                else sort(value)
                for k, value in node.items()
            }
        if isinstance(node, list):
            return [sort(v) for v in node]
        return node

    return sort(tomllib.loads(text))


def _comments(text: str) -> list[str]:
    return sorted(line[line.index("#"):].strip() for line in text.splitlines() if "#" in line and '"#' not in line)


def test_messy_fixture_matches_golden():
    text = MESSY.read_text()
    formatted = format_text(text)
    check_golden("fmt_messy.toml", formatted)
    assert _data(formatted) == _data(text)
    assert _comments(formatted) == _comments(text)


@pytest.mark.parametrize("path", sorted(shipped_root().glob("2026.*.toml")), ids=lambda p: p.name)
def test_shipped_files_keep_data_and_comments(path):
    text = path.read_text()
    formatted = format_text(text)
    assert _data(formatted) == _data(text)
    assert _comments(formatted) == _comments(text)
    assert format_text(formatted) == formatted


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(policies())
def test_random_policies_idempotent_and_data_preserving(text):
    formatted = format_text(text)
    assert _data(formatted) == _data(text)
    assert format_text(formatted) == formatted


def test_not_toml_is_an_error():
    with pytest.raises(FormatError):
        format_text("a = [\n")


def test_cli_check_diff_and_write(cli, tmp_path):
    target = tmp_path / "p.toml"
    shutil.copy(MESSY, target)
    code, out, _ = cli("fmt", "--check", str(tmp_path))
    assert code == 1 and out.startswith("Would reformat:")
    code, out, _ = cli("fmt", "--diff", str(target))
    assert code == 1 and out.startswith("---")
    assert cli("fmt", str(target))[0] == 0
    assert cli("fmt", "--check", str(target))[0] == 0
    (tmp_path / "bad.toml").write_text("a = [\n")
    assert cli("fmt", "--check", str(tmp_path / "bad.toml"))[0] == 2
    assert cli("fmt", str(tmp_path / "missing"))[0] == 2
