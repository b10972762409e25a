"""Naming a policy on the command line: a file, a folder, or a version id of the chosen policies."""

from __future__ import annotations

import os
from pathlib import Path

from ..errors import PolicyError
from ..evaluate.policyset import PolicySet, load

__all__ = ["load_policy_argument"]


def load_policy_argument(text: str, folder: Path | None = None, *, accept_unmodelled: bool = False) -> PolicySet | str:
    """The policy set ``text`` names, or why it names none.

    A path that exists is a policy file or a folder (its newest version; ``FOLDER@VERSION`` picks
    one); a TensorRT-LLM release (``v1.3.0rc25``) stands for the policy version that models it
    (:func:`kvpolicy.evaluate.choice.choose_version`: a release no version models raises
    :class:`kvpolicy.read.releases.UnmodelledRelease` unless ``accept_unmodelled``); anything else is a
    version id. Versions are looked up in ``folder``, the policies the command uses
    (:func:`kvpolicy.read.policyroot.policy_source`; None: the shipped ones)."""
    try:
        if os.path.lexists(text):  # lexists: a dangling or looping symlink is reported by the reader
            return load(text)
        named, sep, version = text.rpartition("@")
        if sep and Path(named).is_dir():
            return load(named, version=version)
        from ..evaluate.choice import choose_version
        from ..read.releases import ReleaseError, UnmodelledRelease, normalise_tag

        if normalise_tag(text) is not None:
            try:
                return choose_version(folder, release=text, accept_unmodelled=accept_unmodelled).policy_set
            except UnmodelledRelease:
                raise
            except ReleaseError as exc:
                return str(exc)
        return load(folder, version=text)
    except PolicyError as exc:
        return str(exc)
