"""``kvpolicy fmt``: rewrite policy files (and their test cases) in canonical form.

Exit codes: 0 nothing to change (or files rewritten), 1 with ``--check``/``--diff`` when a file
would change, 2 a usage error or a file that is not TOML.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from .common import fail

__all__ = ["register"]


def register(sub: Any) -> None:
    """Add ``fmt``."""
    parser = sub.add_parser(
        "fmt",
        help="format policy files canonically (key and row order, spacing), keeping comments",
        description=(
            "Rewrite policy files and their .cases.toml in canonical form: keys in a fixed order, preference rows "
            "sorted by architecture, canonical spacing; comments are kept. With no PATHS, formats ./policies/."
        ),
    )
    parser.add_argument("paths", nargs="*", metavar="PATHS", help="TOML files or folders (default: ./policies)")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--check", action="store_true", help="change nothing; exit 1 if a file would change")
    mode.add_argument("--diff", action="store_true", help="change nothing; print a diff and exit 1 if a file would change")
    parser.set_defaults(run=run_fmt)


def _files(paths: list[str]) -> list[Path] | str:
    files: list[Path] = []
    for name in paths:
        path = Path(name)
        if path.is_dir():
            files += sorted(path.glob("*.toml"))
        elif path.is_file():
            files.append(path)
        else:
            return f"{name}: no such file or folder"
    return files


def run_fmt(args: Any) -> int:
    """Format, check or diff."""
    from ..lint.fmt import FormatError, diff, format_text
    from ..loader import display_path

    paths = args.paths
    if not paths:
        if not Path("policies").is_dir():
            return fail("no PATHS given and ./policies/ does not exist; name the files or folders to format")
        paths = ["policies"]
    files = _files(paths)
    if isinstance(files, str):
        return fail(files)
    changed: list[str] = []
    broken = 0
    for path in files:
        shown = display_path(path)
        try:
            before = path.read_text(encoding="utf-8")
            after = format_text(before)
        except (OSError, UnicodeDecodeError) as exc:
            print(f"kvpolicy fmt: error: cannot read {shown}: {exc}", file=sys.stderr)
            broken += 1
            continue
        except FormatError as exc:
            print(f"kvpolicy fmt: error: {shown} is not valid TOML: {exc}", file=sys.stderr)
            broken += 1
            continue
        if after == before:
            continue
        changed.append(shown)
        if args.diff:
            sys.stdout.write(diff(shown, before, after))
        elif args.check:
            print(f"Would reformat: {shown}")
        else:
            path.write_text(after, encoding="utf-8")
    unchanged = len(files) - len(changed) - broken
    verb = "would be reformatted" if args.check or args.diff else "reformatted"
    print(f"{len(changed)} file{'s' if len(changed) != 1 else ''} {verb}, {unchanged} already formatted", file=sys.stderr)
    if broken:
        return 2
    return 1 if changed and (args.check or args.diff) else 0
