"""``kvpolicy fmt``: rewrite policy files (and their test cases) in canonical form.

Exit codes: 0 nothing to change (or files rewritten), 1 with ``--check``/``--diff`` when a file
would change, 2 a usage error or a file that is not TOML.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

from .common import fail, own_policies

__all__ = ["check_format", "register"]

#: Cache entries (:mod:`kvpolicy.read.cache`) naming files found already canonical.
_CANONICAL = "fmt-canonical-1"


def register(sub: Any) -> None:
    """Add ``fmt``."""
    parser = sub.add_parser(
        "fmt",
        help="format policy files canonically (key and row order, spacing), keeping comments",
        description=(
            "Rewrite policy files and their .cases.toml in canonical form: keys in a fixed order, preference rows "
            "sorted by architecture, canonical spacing; comments are kept. With no PATHS, formats the folder "
            "[tool.kvpolicy] policies names, else ./policies/."
        ),
    )
    parser.add_argument("paths", nargs="*", metavar="PATHS", help="TOML files or folders (default: [tool.kvpolicy] policies, else ./policies)")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--check", action="store_true", help="change nothing; exit 1 if a file would change")
    mode.add_argument("--diff", action="store_true", help="change nothing; print a diff and exit 1 if a file would change")
    parser.set_defaults(run=run_fmt)


def _files(paths: list[str]) -> list[tuple[Path, Path]] | str:
    """(file, its policy folder) for every TOML file the paths name."""
    files: list[tuple[Path, Path]] = []
    for name in paths:
        path = Path(name)
        if path.is_dir():
            files += [(found, path) for found in sorted(path.glob("*.toml"))]
        elif os.path.lexists(path):  # a FIFO or a looping symlink is refused by the reader, with a message
            files.append((path, path.parent))
        else:
            return f"{name}: no such file or folder"
    if not files:
        return f"no TOML files in {', '.join(paths)}"
    return files


def check_format(paths: list[str], *, cache: bool = True) -> tuple[list[tuple[Path, str, str, str]], list[str], int] | str:
    """Format every file in memory: ([(path, shown, before, after) of files that would change],
    [errors], files read), or why the paths cannot be used. Files are read as every command reads
    policy files (regular files, size cap, structure bounds before parsing)."""
    from ..read.cache import cached_entry, code_fingerprint, digest, remember_entry
    from ..errors import PolicyError
    from ..lint.fmt import FormatError, format_text
    from ..read.loader import display_path
    from ..read.policyfile import read_policy_bytes
    from ..read.scan import check_text

    files = _files(paths)
    if isinstance(files, str):
        return files
    changed: list[tuple[Path, str, str, str]] = []
    errors: list[str] = []
    for path, root in files:
        shown = display_path(path)
        try:
            raw = read_policy_bytes(path, shown, root=root)
            # Bytes this code formatted before and found canonical are canonical still: the
            # formatter reads nothing else (tomlkit's parse costs ~40 ms a file).
            key = digest("kvpolicy-fmt-1", code_fingerprint(), raw)
            if cache and cached_entry(_CANONICAL, key) == key:
                continue
            check_text(raw, shown)
            before = raw.decode("utf-8")
            after = format_text(before)
        except PolicyError as exc:
            errors.append(str(exc.problems[0]))
            continue
        except UnicodeDecodeError:
            errors.append(f"{shown}: the file is not UTF-8 text")
            continue
        except FormatError as exc:
            errors.append(f"{shown} is not valid TOML: {exc}")
            continue
        if after != before:
            changed.append((path, shown, before, after))
        elif cache:
            remember_entry(_CANONICAL, key, key)
    return changed, errors, len(files)


def run_fmt(args: Any) -> int:
    """Format, check or diff."""
    paths = args.paths
    if not paths:
        chosen = own_policies("format")
        if isinstance(chosen, int):
            return chosen
        paths, source = chosen
        if source is not None:  # on stderr, with fmt's summary: stdout carries what --diff prints
            print(source.describe(), file=sys.stderr)
    from ..lint.fmt import diff

    checked = check_format(paths)
    if isinstance(checked, str):
        return fail(checked)
    changed, errors, count = checked
    for error in errors:
        print(f"kvpolicy fmt: error: {error}", file=sys.stderr)
    for path, shown, before, after in changed:
        if args.diff:
            sys.stdout.write(diff(shown, before, after))
        elif args.check:
            print(f"Would reformat: {shown}")
        else:
            path.write_text(after, encoding="utf-8")
    unchanged = count - len(changed) - len(errors)
    verb = "would be reformatted" if args.check or args.diff else "reformatted"
    print(f"{len(changed)} file{'s' if len(changed) != 1 else ''} {verb}, {unchanged} already formatted", file=sys.stderr)
    if errors:
        return 2
    return 1 if changed and (args.check or args.diff) else 0
