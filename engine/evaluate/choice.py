"""Which policy version answers: one function for the API and the CLI.

In order: the version named (``version``); the version a TensorRT-LLM release maps to (``release``);
the installed TensorRT-LLM's release (where the policies are the shipped ones, or a folder of
versions); else the newest version. A release that no policy version models is never answered with
another version silently: :class:`kvpolicy.read.releases.UnmodelledRelease` says which version
comes closest and what it misses, and only ``accept_unmodelled=True`` answers with it (the choice
then carries the warning).
"""

from __future__ import annotations

from pathlib import Path

from ..errors import PolicyError
from ..records import FrozenRecord
from .policyset import PolicySet, load as load_version

TYPE_CHECKING = False  # typing itself costs a cold start milliseconds
if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Any

    from ..read.releases import Release
    from .resolution import Resolution

__all__ = ["VersionChoice", "choose_version", "load", "resolve"]

#: How a version was chosen.
HOWS = ("version", "release", "installed", "newest")


class VersionChoice(FrozenRecord):
    """The chosen ``policy_set``, ``how`` it was chosen (one of :data:`HOWS`), the release text
    ``given`` (None unless a release chose), its table row ``release`` (None when the table does
    not list it), and ``warning``: why the answer is a risk the caller accepted (None when it
    models the release)."""

    __slots__ = ("policy_set", "how", "given", "release", "warning")
    policy_set: PolicySet
    how: str
    given: str | None
    release: Release | None
    warning: str | None


def choose_version(
    path: str | Path | None = None,
    *,
    version: str | None = None,
    release: str | None = None,
    accept_unmodelled: bool = False,
    installed: bool | None = None,
) -> VersionChoice:
    """The policy version that answers (see the module's docstring).

    ``installed`` says whether the installed TensorRT-LLM's release picks the default (None: where
    ``path`` is None, the shipped policies). Raises :class:`kvpolicy.PolicyError` for a broken or
    missing policy, :class:`kvpolicy.read.releases.UnmodelledRelease` for a release no version
    models (unless accepted), :class:`kvpolicy.read.releases.ReleaseError` for a text that names no
    release, and ValueError when both ``version`` and ``release`` are given."""
    if version is not None:
        if release is not None:
            raise ValueError("version and release both pick the policy version: give one of them")
        return VersionChoice(load_version(path, version=version), "version", None, None, None)
    how = "release"
    if release is None:
        if installed is None:
            installed = path is None
        if installed and (path is None or Path(path).is_dir()):
            from ..read.releases import installed_trtllm

            release = installed_trtllm()
            how = "installed"
        if release is None:
            return VersionChoice(load_version(path), "newest", None, None, None)
    return _for_release(path, release, how, accept_unmodelled)


def _for_release(path: str | Path | None, given: str, how: str, accept: bool) -> VersionChoice:
    from ..read.releases import UnmodelledRelease, policy_version_for

    try:
        row = policy_version_for(given)
    except UnmodelledRelease as exc:
        if not accept or exc.closest is None:
            raise
        try:
            policy_set = load_version(path, version=exc.closest)
        except PolicyError:
            policy_set = load_version(path)
        warning = f"TensorRT-LLM {given} is not modelled; answering with policy {policy_set.version}, which misses {exc.misses}"
        return VersionChoice(policy_set, how, given, exc.release, warning)
    try:
        return VersionChoice(load_version(path, version=row.policy_version), how, given, row, None)
    except PolicyError as exc:
        missing = len(exc.problems) == 1 and exc.problems[0].check == "version"
        if not missing:
            raise
        where = "the shipped policies" if path is None else f"the policies in {path}"
        newest = load_version(path)
        misses = f"whatever policy {row.policy_version} models that {newest.version} of {where} does not"
        if accept:
            warning = f"TensorRT-LLM {row.tag} is policy {row.policy_version}, which {where} do not hold; answering with {newest.version}"
            return VersionChoice(newest, how, given, row, warning)
        raise UnmodelledRelease(
            f"TensorRT-LLM {row.tag} is policy {row.policy_version}, but {where} hold no such version; the closest is their "
            f"newest, {newest.version}. Accept that risk explicitly with --accept-unmodelled (API: accept_unmodelled=True), "
            f"pick a version with --version V, or use the shipped policies (--policy off the folder)",
            given,
            row,
            newest.version,
            misses,
        ) from None


def load(
    path: str | Path | None = None,
    *,
    version: str | None = None,
    release: str | None = None,
    accept_unmodelled: bool = False,
) -> PolicySet:
    """Load a policy set (``kvpolicy.load``).

    ``path`` is a policy file, a folder of policy files (one per version), or ``None`` for the
    policies shipped with kvpolicy. ``version`` picks a version from the folder; ``release`` (a
    TensorRT-LLM release, ``v1.3.0rc26``) picks the version that models it. With neither, the
    shipped policies answer with the installed TensorRT-LLM's release, else the newest version (as
    ``kvpolicy resolve`` does); a folder answers with its newest. Raises :class:`kvpolicy.PolicyError`
    (with ``file:line:col``) for a broken policy, and :class:`kvpolicy.read.releases.UnmodelledRelease`
    for a release no policy version models, naming the closest one: ``accept_unmodelled=True``
    answers with that one instead, with a warning (:func:`choose_version`).
    """
    if release is not None or (version is None and path is None):
        choice = choose_version(path, version=version, release=release, accept_unmodelled=accept_unmodelled)
        if choice.warning:
            import warnings

            warnings.warn(choice.warning, stacklevel=2)
        return choice.policy_set
    return load_version(path, version=version)


_DEFAULT: PolicySet | None = None


def resolve(config: Mapping[str, Any] | None = None, /, **fields: Any) -> Resolution:
    """Resolve a serving context with the shipped policy :func:`load` chooses: the installed
    TensorRT-LLM's release, else the newest (an unmodelled release raises, see :func:`load`)."""
    global _DEFAULT
    if _DEFAULT is None:
        _DEFAULT = load()
    return _DEFAULT.resolve(config, **fields)
