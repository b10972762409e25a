"""Loading policies: a file, a folder of versions, or the shipped policies."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path

from ..errors import Location, PolicyError, PolicyProblem
from ..read.policyfile import CASES_SUFFIX, display_path, policy_files, read_policy_bytes, shipped_root, version_key
from .resolution import Resolution

TYPE_CHECKING = False  # typing itself costs a cold start milliseconds
if TYPE_CHECKING:
    from typing import Any

if TYPE_CHECKING:
    from .compiler import CompiledIndex
    from ..read.model import Policy
    from .interpreter import Program

__all__ = ["PolicySet", "load"]


class PolicySet:
    """One compiled policy version, ready to resolve contexts.

    ``versions()`` lists every version beside it (in its folder, or shipped with kvpolicy).

    A set loaded from the compiled-policy cache (:mod:`kvpolicy.read.cache`) holds only its decision
    index: ``resolve`` needs nothing else. The typed model (``policy``) and the interpreter that
    writes traces are built from the same bytes the first time they are asked for.
    """

    # No __slots__: ``resolve`` is set on each instance (the generated closure over this set),
    # shadowing the method below, so that a call costs one Python call.

    def __init__(self, policy: Policy, siblings: dict[str, Path] | None = None) -> None:
        from .interpreter import Program

        self._policy: Policy | None = policy
        self._compiled: Program | None = Program(policy)
        self._index = self._compiled.index
        self._bind()
        self._raw: bytes | None = None
        self._path = policy.path
        self._siblings = siblings or {policy.version: Path(policy.path)}

    @classmethod
    def _from_index(cls, index: CompiledIndex, raw: bytes, siblings: dict[str, Path] | None = None) -> PolicySet:
        """A set resolved from a decision index alone (``raw``: the file's bytes, for the model)."""
        self = object.__new__(cls)
        self._policy = None
        self._compiled = None
        self._index = index
        self._bind()
        self._raw = raw
        self._path = index.path
        self._siblings = siblings or {index.version: Path(index.path)}
        return self

    def _bind(self) -> None:
        resolve = self._index.entry(self)
        resolve.__doc__ = PolicySet.resolve.__doc__
        resolve.__qualname__ = "PolicySet.resolve"
        self.resolve = resolve  # type: ignore[method-assign]  # each instance carries its own generated resolve

    @property
    def policy(self) -> Policy:
        """The typed model of the policy (built on first use when the set came from the cache)."""
        if self._policy is None:
            from ..read.loader import parse_policy

            assert self._raw is not None
            self._policy = parse_policy(self._raw, self._path)
        return self._policy

    @property
    def _program(self) -> Program:
        if self._compiled is None:
            from .interpreter import Program

            self._compiled = Program(self.policy, self._index)
        return self._compiled

    @property
    def version(self) -> str:
        """The content version, e.g. ``2026.09.10``."""
        return self._index.version

    @property
    def digest(self) -> str:
        """sha256 of the policy file's bytes."""
        return self._index.digest

    @property
    def path(self) -> str:
        """The policy file this set was loaded from."""
        return self._path

    @property
    def decisions(self) -> tuple[str, ...]:
        """Decision names in evaluation order."""
        return self._index.order

    @property
    def architectures(self) -> frozenset[str]:
        """Every architecture the policy names (preference rows and conditions)."""
        return self._index.named

    def models(self) -> tuple[tuple[str | None, str | None], ...]:
        """The classes of models this version tells apart: (architecture, model_type) pairs, ``None``
        standing for every architecture (or model_type) it does not name."""
        return self._index.models()

    def resolve_normalised(self, context: Mapping[str, Any]) -> Resolution:
        """The resolution of a context as ``Resolution.context`` holds it (already normalised)."""
        ctx = dict(context)
        if ctx.get("backend") is None:
            return Resolution({}, {}, (), ctx, self)
        values, decided_by, diagnostics = self._index.evaluate(ctx)
        return Resolution(values, decided_by, diagnostics, ctx, self)

    def verdict_of(self, resolution: Resolution) -> Any:
        """A :class:`kvpolicy.evaluate.verdict.Verdict`: whether a context this version resolved starts for
        every model it may be about."""
        from .verdict import verdict_of

        return verdict_of(self, resolution)

    def verdict(self, config: Mapping[str, Any] | None = None, /, **fields: Any) -> Any:
        """Resolve a context and say what holds for every model it may be about: a
        :class:`kvpolicy.evaluate.verdict.Verdict` (see :meth:`Resolution.verdict`)."""
        return self.verdict_of(self.resolve(config, **fields))

    def left_out(self) -> dict[str, tuple[str, str]]:
        """For each decision whose field, left out of a config, requests something other than auto
        (upstream's field default): that request and the upstream source that says so."""
        return {d["name"]: (d["omitted"], d["omitted_source"]) for d in self._index.data["decisions"] if d["omitted_source"]}

    def env_names(self) -> frozenset[str]:
        """The environment variables this version reads (in a condition, or as a feature's switch)."""
        from .hints import read_env

        return read_env(self.policy)

    @property
    def features(self) -> frozenset[str]:
        """The feature names a context may carry."""
        return self._index.features

    def versions(self) -> list[str]:
        """Every version available beside this one, oldest first."""
        return sorted(self._siblings, key=version_key)

    def normalise(self, config: Mapping[str, Any] | None = None, /, **fields: Any) -> dict[str, Any]:
        """The normalised context ``resolve`` would answer (raises :class:`ContextError`)."""
        return self._index.normalise(config, fields)

    def outcome(self, context: dict[str, Any]) -> Any:
        """Values, deciding rules and message-less diagnostics of a normalised context, fast.

        For analyses over a whole domain (see :mod:`kvpolicy.evaluate.domain`); ``resolve`` is the API."""
        return self._index.outcome(context)

    def trace(self, context: Mapping[str, Any]) -> Any:
        """The trace of a normalised context (what ``Resolution.trace`` shows)."""
        return self._program.trace(dict(context))

    def resolve(self, config: Mapping[str, Any] | None = None, /, **fields: Any) -> Resolution:
        """Resolve a serving context (a ``cache_transceiver_config`` mapping and/or fields)."""
        # Reached only through the class (``PolicySet.resolve(policy_set, ...)``): instances
        # carry their own generated ``resolve``.
        return self.__dict__["resolve"](config, **fields)

    def notes(self, context: Mapping[str, Any]) -> list[str]:
        """Notes on a normalised context that resolves, but probably not as meant (a misspelt
        architecture, an environment value the policy never reads); see :mod:`kvpolicy.evaluate.hints`."""
        from .hints import notes

        data = self._index.data
        return notes(self.version, data["architectures"], {k: set(v) for k, v in data["known_env"]}, context)

    def __repr__(self) -> str:
        return f"<PolicySet {self.version} from {self.path}>"


_VERSION_LINE = re.compile(r'^version\s*=\s*"([^"\\]*)"\s*(?:#.*)?$', re.MULTILINE)


def _top_level(text: str, offset: int) -> bool:
    """Whether ``offset`` lies before the first table header (so the key is top-level)."""
    header = re.search(r"^\s*\[", text, re.MULTILINE)
    return header is None or header.start() > offset


def _versions_in(folder: Path) -> dict[str, Path]:
    """Map version -> file for a folder, reading only each file's ``version`` key.

    Every file goes through the same reader as a full load: a file that is not a regular file, too
    large, or a symlink out of the folder makes the folder unusable (as ``kvpolicy lint`` reports)."""
    found: dict[str, Path] = {}
    problems: list[PolicyProblem] = []
    for path in policy_files(folder):
        try:
            # allow-symlinks is read from pyproject.toml only when a symlink is met
            raw = read_policy_bytes(path, display_path(path), root=folder)
        except PolicyError as exc:
            problems += exc.problems
            continue
        try:
            text = raw.decode("utf-8")
            # A top-level `version = "..."` line is the common case; parsing the whole file only to
            # read one key cost ~12 ms per file here, most of a cold start.
            match = _VERSION_LINE.search(text)
            if match and _top_level(text, match.start()):
                version = match.group(1)
            else:
                import tomllib

                from ..read.scan import check_text  # (the scan's patterns: not on a cold start's path)

                check_text(raw, str(path))
                version = tomllib.loads(text).get("version")
        except (UnicodeDecodeError, ValueError, PolicyError, RecursionError):
            # The full load reports the problem with its location if this file is the one asked for.
            found.setdefault(f"?{path.name}", path)
            continue
        if not isinstance(version, str):
            problems.append(PolicyProblem(Location(str(path)), "version", "the file has no string `version`; add one"))
            continue
        if version in found:
            problems.append(
                PolicyProblem(
                    Location(str(path)),
                    "version",
                    f"version {version} is also declared by {found[version]}; give each file its own version",
                )
            )
            continue
        found[version] = path
    if problems:
        raise PolicyError(problems)
    return found


def load(path: str | Path | None = None, *, version: str | None = None) -> PolicySet:
    """Load a policy set, whatever TensorRT-LLM is installed.

    ``path`` is a policy file, a folder of policy files (one per version), or ``None`` for the
    policies shipped with kvpolicy. ``version`` picks a version from the folder; by default the
    newest. Raises :class:`kvpolicy.PolicyError` (with ``file:line:col``) for a broken policy.
    The public ``kvpolicy.load`` (:func:`kvpolicy.evaluate.choice.load`) also chooses by release.
    """
    if path is not None and not isinstance(path, (str, Path)):
        raise PolicyError(
            PolicyProblem(Location(repr(path)[:60]), "io", f"path must be a str or pathlib.Path naming a policy file or folder, not {type(path).__name__}")
        )
    root = shipped_root() if path is None else Path(path)
    if os.path.lexists(root) and not root.is_dir():
        if root.name.endswith(CASES_SUFFIX):
            target = root.name[: -len(CASES_SUFFIX)] + ".toml"
            raise PolicyError(
                PolicyProblem(
                    Location(display_path(root)),
                    "io",
                    f"this is a test file (policy test cases for `kvpolicy test`), not a policy; name the policy it tests, e.g. {target}",
                )
            )
        policy_set = _load_file(root)
        if version is not None and policy_set.version != version:
            raise PolicyError(PolicyProblem(Location(str(root)), "version", f"the file holds version {policy_set.version}, not {version}"))
        return policy_set
    if not root.is_dir():
        raise PolicyError(PolicyProblem(Location(str(root)), "io", "no such policy file or folder"))
    versions = _versions_in(root)
    real = {v: p for v, p in versions.items() if not v.startswith("?")}
    if version is None:
        if not real:
            unreadable = [p for v, p in versions.items() if v.startswith("?")]
            if unreadable:
                _load_file(unreadable[0], root=root)  # raises with the location of the problem
            raise PolicyError(PolicyProblem(Location(str(root)), "io", "the folder holds no policy files (*.toml)"))
        version = max(real, key=version_key)
    if version not in real:
        raise PolicyError(
            PolicyProblem(
                Location(str(root)),
                "version",
                f"no policy version {version}; available: {', '.join(sorted(real, key=version_key)) or 'none'}",
            )
        )
    return _load_file(real[version], root=root, siblings=real)


def _load_file(path: Path, *, root: Path | None = None, siblings: dict[str, Path] | None = None) -> PolicySet:
    """One policy file as a policy set: from the compiled-policy cache when the same bytes were
    compiled before by the same kvpolicy, else parsed, checked and compiled (and stored)."""
    from ..read import cache

    shown = display_path(path)
    raw = read_policy_bytes(path, shown, root=root)
    from .index import FORMAT

    key = cache.index_key(raw, FORMAT)
    data = cache.cached_index(key)
    if data is not None:
        from .compiler import CompiledIndex
        from .indexcheck import check_index

        try:
            check_index(data)
            if data["digest"] == cache.sha256(raw):
                return PolicySet._from_index(CompiledIndex(data, shown), raw, siblings)
        except Exception:  # noqa: BLE001 - a bad entry is a miss, whatever is wrong with it
            pass
    from ..read.loader import parse_policy

    policy_set = PolicySet(parse_policy(raw, shown), siblings)
    cache.remember_index(key, policy_set._index.data)
    return policy_set
