"""The lint rule catalogue (being split into one module per category)."""

from .precedence import *  # noqa: F403
from .precedence import PLACEHOLDER, Severity  # noqa: F401
