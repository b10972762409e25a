"""From a resolution to a running transceiver.

:func:`open_transceiver` reads the decided runtime and backend from a ``kvpolicy`` resolution and
opens the implementation for them. PYTHON over NIXL lives in this package; any other runtime (CPP
lives in TensorRT-LLM) plugs in through the entry-point group ``kvpolicy.transceivers``, whose entry
names are ``RUNTIME`` or, more specific, ``RUNTIME:BACKEND``; each entry point is a callable
``factory(resolution, pool, **options) -> Transceiver``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from importlib.metadata import entry_points
from typing import Any, Protocol, runtime_checkable

from .pool import BlockPool
from .request import TransferHandle

ENTRY_POINT_GROUP = "kvpolicy.transceivers"


@runtime_checkable
class Transceiver(Protocol):
    """What every runtime's transceiver offers. :class:`NixlTransceiver` is the reference."""

    runtime: str
    backend: str
    address: str

    def connect(self, address: str, *, timeout_s: float | None = None) -> Any:
        """Connect to a sender."""

    # send and receive take (request_id: str, block_ids: Sequence[int]) and keyword options that are
    # each runtime's own: typed as callables, since a method with **options would oblige every
    # runtime to accept every keyword.
    @property
    def send(self) -> Callable[..., TransferHandle]:
        """``send(request_id, block_ids, **options)``: offer a request's blocks."""

    @property
    def receive(self) -> Callable[..., TransferHandle]:
        """``receive(request_id, block_ids, **options)``: fetch a request's blocks into this pool."""

    def cancel(self, request_id: str) -> bool:
        """Cancel a request on this side."""

    def close(self) -> None:
        """Release everything."""


class TransceiverSelectionError(ValueError):
    """The resolution cannot be turned into a transceiver. The message names the decision, the rule
    that made it, and how to change it."""

    def __init__(self, message: str, *, decision: str | None = None, rule: str | None = None) -> None:
        super().__init__(message)
        self.decision = decision
        self.rule = rule


def _context_value(resolution: Any, key: str) -> Any:
    context = getattr(resolution, "context", None)
    if isinstance(context, Mapping):
        return context.get(key)
    return getattr(context, key, None)


def _rule(resolution: Any, decision: str) -> str:
    decided_by = getattr(resolution, "decided_by", None) or {}
    rule = decided_by.get(decision) if isinstance(decided_by, Mapping) else None
    version = getattr(resolution, "policy_version", None)
    rule_text = f"rule {rule!r}" if rule else "no recorded rule"
    return f"{rule_text} of policy version {version}" if version else rule_text


def _describe_errors(errors: Iterable[Any]) -> str:
    lines = []
    for error in errors:
        where = f" ({error.location})" if getattr(error, "location", None) else ""
        decision = f" [decision {error.decision}]" if getattr(error, "decision", None) else ""
        lines.append(f"  - {getattr(error, 'id', '?')}{decision}: {getattr(error, 'message', error)}{where}")
    return "\n".join(lines)


def timeout_from(resolution: Any, override_s: float | None = None) -> float:
    """The request timeout in seconds: ``override_s`` if given, else the resolution's
    ``kv_transfer_timeout_ms``. A missing or null timeout is refused: a transfer must be able to fail."""
    if override_s is not None:
        return float(override_s)
    timeout_ms = _context_value(resolution, "kv_transfer_timeout_ms")
    if timeout_ms is None:
        raise TransceiverSelectionError(
            "kv_transfer_timeout_ms is null: the transceiver needs a finite timeout, since a lost peer or "
            "result frame would otherwise hang the request forever. Set kv_transfer_timeout_ms (e.g. "
            "resolve(..., kv_transfer_timeout_ms=60000)) or pass timeout_s= to open_transceiver.",
            decision="kv_transfer_timeout_ms",
        )
    if isinstance(timeout_ms, bool) or not isinstance(timeout_ms, (int, float)) or timeout_ms <= 0:
        raise TransceiverSelectionError(
            f"kv_transfer_timeout_ms must be a positive number of milliseconds, got {timeout_ms!r}",
            decision="kv_transfer_timeout_ms",
        )
    return timeout_ms / 1000.0


def _open_python_nixl(resolution: Any, pool: BlockPool, **options: Any) -> Transceiver:
    from .transceiver import NixlTransceiver

    options["timeout_s"] = timeout_from(resolution, options.get("timeout_s"))
    return NixlTransceiver(pool, **options)


BUILTIN: dict[str, Callable[..., Transceiver]] = {"PYTHON:NIXL": _open_python_nixl}
"""Implementations shipped in this package, by ``RUNTIME:BACKEND``."""


def _plugin(runtime: str, backend: str | None) -> Callable[..., Transceiver] | None:
    candidates = [f"{runtime}:{backend}", runtime] if backend else [runtime]
    found = {ep.name: ep for ep in entry_points(group=ENTRY_POINT_GROUP)}
    for name in candidates:
        if name in found:
            return found[name].load()
    return None


def find_transceiver(resolution: Any) -> Callable[..., Transceiver]:
    """The factory of the transceiver ``resolution`` calls for, without opening anything.

    Raises :class:`TransceiverSelectionError` exactly where :func:`open_transceiver` would (errors
    in the resolution, disaggregation off, a runtime whose transceiver is not installed), so a
    caller can check a configuration before it starts any worker.
    """
    errors = list(getattr(resolution, "errors", ()) or ())
    if errors or getattr(resolution, "ok", True) is False:
        raise TransceiverSelectionError(
            "the resolution has errors, so no transceiver is opened:\n"
            + _describe_errors(errors)
            + "\nFix the inputs named above (or the policy) and resolve again.",
            decision=getattr(errors[0], "decision", None) if errors else None,
        )
    runtime = getattr(resolution, "runtime", None)
    backend = getattr(resolution, "backend", None)
    if runtime is None:
        raise TransceiverSelectionError(
            f"transceiver_runtime resolved to none ({_rule(resolution, 'transceiver_runtime')}): KV-cache "
            "transfer is off for this configuration. Set backend= (e.g. backend='NIXL') and "
            "transceiver_runtime= to enable disaggregated serving.",
            decision="transceiver_runtime",
            rule=(getattr(resolution, "decided_by", None) or {}).get("transceiver_runtime"),
        )
    factory = BUILTIN.get(f"{runtime}:{backend}") or _plugin(runtime, backend)
    if factory is None:
        decided = _rule(resolution, "transceiver_runtime")
        backend_rule = _rule(resolution, "backend")
        installed = sorted(set(BUILTIN) | {ep.name for ep in entry_points(group=ENTRY_POINT_GROUP)})
        raise TransceiverSelectionError(
            f"transceiver_runtime={runtime} (decided by {decided}) with backend={backend} (decided by "
            f"{backend_rule}) has no transceiver installed here; installed: {installed}. To change it: "
            f"set transceiver_runtime explicitly (e.g. resolve(..., transceiver_runtime='PYTHON', "
            f"backend='NIXL')), or install a package that provides '{runtime}:{backend}' or '{runtime}' "
            f"in the entry-point group '{ENTRY_POINT_GROUP}'.",
            decision="transceiver_runtime",
            rule=(getattr(resolution, "decided_by", None) or {}).get("transceiver_runtime"),
        )
    return factory


def open_transceiver(resolution: Any, pool: BlockPool, **options: Any) -> Transceiver:
    """Open the transceiver for the runtime and backend ``resolution`` decided, over ``pool``.

    ``options`` go to the implementation (for PYTHON + NIXL: ``allowed_peers`` (required) and
    ``identity`` (the CURVE keys, see ``kvpolicy keys``), ``timeout_s``, ``name``, ``host``, ``port``,
    ``settings``, ``limits``, ``log_requests``, ``metadata``, ``allow_reads``). The request timeout defaults to the
    resolution's ``kv_transfer_timeout_ms``.

    Raises :class:`TransceiverSelectionError` if the resolution has errors, turns disaggregation off,
    or decided a runtime whose transceiver is not installed; the message names the decision, the rule
    that made it and how to change it.
    """
    return find_transceiver(resolution)(resolution, pool, **options)
