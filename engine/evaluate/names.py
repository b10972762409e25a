"""Architecture names: telling a misspelt architecture from a real one the policy does not name.

An architecture a policy does not name resolves as "any other model", so a typo
(``LlamaForCausalLm``, ``LLamaForCausalLM``) silently changes the answer. A *near miss* is a name
the policy does not name that differs from one it does only in case, ``_``/``-``, or one letter
(added, dropped, changed or swapped with its neighbour), and that is not itself a real
architecture. Digits never make a near miss: ``Gemma2`` / ``Gemma3`` and ``DeepseekV2`` /
``DeepseekV3`` are different models.

"Real" means listed in ``known_architectures.txt`` beside this module: every class name of
transformers' auto mappings (``python -m kvpolicy.evaluate.names`` regenerates it from the installed
transformers; its first line says which version). It is read only when a name is not named by the
policy, so resolving a named architecture never pays for it.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

from ..wording import closest

__all__ = ["is_known", "near_miss"]

_LIST = Path(__file__).with_name("known_architectures.txt")


@lru_cache(maxsize=1)
def _known() -> frozenset[str]:
    try:
        text = _LIST.read_text(encoding="utf-8")
    except OSError:
        return frozenset()
    return frozenset(line.strip() for line in text.splitlines() if line.strip() and not line.startswith("#"))


def is_known(name: str) -> bool:
    """Whether ``name`` is a real model class name (transformers' auto mappings)."""
    return name in _known()


def near_miss(name: str, named: frozenset[str] | set[str] | list[str]) -> str | None:
    """The architecture of ``named`` that ``name`` is probably a misspelling of, or None.

    None when ``name`` is named itself, is a real architecture, or is not close to any."""
    if name in named:
        return None
    close = closest(name, named, separators=True, one_letter=True)
    if close is None or is_known(name):
        return None
    return close


def main() -> int:
    """Regenerate ``known_architectures.txt`` from the installed transformers."""
    import transformers
    from transformers.models.auto import modeling_auto

    names: set[str] = set()
    for attribute in dir(modeling_auto):
        if attribute.endswith("_MAPPING_NAMES"):
            for value in getattr(modeling_auto, attribute).values():
                names.update([value] if isinstance(value, str) else value)
    header = f"# Model class names of transformers {transformers.__version__}'s auto mappings; `python -m kvpolicy.evaluate.names` regenerates it.\n"
    _LIST.write_text(header + "\n".join(sorted(names)) + "\n", encoding="utf-8")
    print(f"{_LIST}: {len(names)} names from transformers {transformers.__version__}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
