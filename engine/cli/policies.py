"""Naming a policy on the command line: a file, a folder, or a version id of the chosen policies."""

from __future__ import annotations

import os
from pathlib import Path

from ..errors import PolicyError
from ..evaluate.policyset import PolicySet, load

__all__ = ["load_policy_argument"]


def load_policy_argument(text: str, folder: Path | None = None) -> PolicySet | str:
    """The policy set ``text`` names, or why it names none.

    A path that exists is a policy file or a folder (its newest version; ``FOLDER@VERSION`` picks
    one); a TensorRT-LLM release (``v1.3.0rc25``) stands for the policy version that reproduces it
    (:mod:`kvpolicy.read.releases`); anything else is a version id. Versions are looked up in ``folder``,
    the policies the command uses (:func:`kvpolicy.read.policyroot.policy_source`; None: the shipped ones)."""
    try:
        if os.path.lexists(text):  # lexists: a dangling or looping symlink is reported by the reader
            return load(text)
        named, sep, version = text.rpartition("@")
        if sep and Path(named).is_dir():
            return load(named, version=version)
        from ..read.releases import ReleaseError, normalise_tag, policy_version_for

        if normalise_tag(text) is not None:
            try:
                release = policy_version_for(text)
            except ReleaseError as exc:
                return str(exc)
            try:
                return load(folder, version=release.policy_version)
            except PolicyError as exc:
                return f"TensorRT-LLM {release.tag} is policy {release.policy_version}: {exc}"
        return load(folder, version=text)
    except PolicyError as exc:
        return str(exc)
