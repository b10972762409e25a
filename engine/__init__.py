"""kvpolicy: declarative, checkable selection of the KV-cache transceiver runtime.

    >>> import kvpolicy
    >>> r = kvpolicy.resolve(architecture="LlamaForCausalLM", backend="NIXL")
    >>> r.runtime, r.decided_by["transceiver_runtime"]
    ('PYTHON', 'runtime-preference[LlamaForCausalLM]')

The engine never imports torch or nixl; the transfer layer lives in :mod:`kvpolicy.transports`.
"""

from .decisionlog import DecisionLog
from .errors import ContextError, PolicyError, PolicyProblem, ResolutionError
from .policyset import PolicySet, load, resolve
from .resolution import Diagnostic, Resolution, Trace, TraceStep
from .source import Location
from .watch import PolicyWatcher

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

__version__ = "0.1.0"
