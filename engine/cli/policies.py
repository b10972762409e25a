"""Naming a policy on the command line: a file, a folder, or a shipped version id."""

from __future__ import annotations

import os
from pathlib import Path

from ..errors import PolicyError
from ..policyset import PolicySet, load

__all__ = ["load_policy_argument"]


def load_policy_argument(text: str) -> PolicySet | str:
    """The policy set ``text`` names, or why it names none.

    A path that exists is a policy file or a folder (its newest version; ``FOLDER@VERSION`` picks
    one); anything else is a version id of the shipped policies."""
    try:
        if os.path.lexists(text):  # lexists: a dangling or looping symlink is reported by the reader
            return load(text)
        folder, sep, version = text.rpartition("@")
        if sep and Path(folder).is_dir():
            return load(folder, version=version)
        return load(None, version=text)
    except PolicyError as exc:
        return str(exc)
