"""kvpolicy: declarative, checkable selection of the KV-cache transceiver runtime.

    >>> import kvpolicy
    >>> r = kvpolicy.resolve(architecture="LlamaForCausalLM", backend="NIXL")
    >>> r.runtime, r.decided_by["transceiver_runtime"]
    ('PYTHON', 'runtime-preference[LlamaForCausalLM]')

The engine never imports torch or nixl; the transfer layer lives in :mod:`kvpolicy.transports`.
"""

from .errors import ContextError, Location, PolicyError, PolicyProblem
from .evaluate.choice import load, resolve
from .evaluate.policyset import PolicySet
from .evaluate.resolution import Diagnostic, Resolution, ResolutionError, Trace, TraceStep

__all__ = [
    "ContextError",
    "DecisionLog",
    "Diagnostic",
    "Location",
    "PolicyError",
    "PolicyProblem",
    "PolicySet",
    "PolicyWatcher",
    "Resolution",
    "ResolutionError",
    "Trace",
    "TraceStep",
    "load",
    "resolve",
]

from .version import __version__ as __version__


def __getattr__(name: str) -> object:
    # Imported on first use: the decision log pulls in logging.handlers (tens of ms of a cold start).
    if name == "DecisionLog":
        from .decisionlog import DecisionLog

        return DecisionLog
    if name == "PolicyWatcher":
        from .watch import PolicyWatcher

        return PolicyWatcher
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
