"""The lint rule catalogue: one small function per rule, with a stable code and a docstring.

Codes never change meaning. ``kvpolicy rule CODE`` prints a rule's docstring; ``kvpolicy rules``
lists them. Rules come in three kinds:

- *loader* rules turn the problems the loader found (``PolicyProblem.check``) into findings; they
  are the only findings for a file that does not load;
- *policy* rules read one loaded policy (its model, its source text and its exact analysis);
- *set* rules compare the files of one run (version hygiene).

One module per category (:data:`CATEGORIES`): :mod:`.syntax`, :mod:`.reference`, :mod:`.precedence`,
:mod:`.safety`, :mod:`.documentation`, :mod:`.versioning`, :mod:`.suppression`, over what they share
in :mod:`.base`. Importing this package registers every rule in :data:`RULES`, in the order below,
which is the catalogue's order.
"""

from __future__ import annotations

# Each category module registers its rules when imported: this order is the catalogue's.
from . import syntax, reference, precedence, safety, documentation, versioning, suppression  # noqa: F401  # imported to register
from .base import ANALYSIS_RULES, CATEGORIES, PLACEHOLDER, RULES, Finding, LintRule, PolicyFile, Severity, catalogue

__all__ = ["ANALYSIS_RULES", "CATEGORIES", "PLACEHOLDER", "RULES", "Finding", "LintRule", "PolicyFile", "Severity", "catalogue"]
