"""Coverage-guided fuzzing of the loader and the resolver with atheris, for a bounded run.

    python bench/fuzz.py load    [--seconds 60]   # policy bytes -> policy or PolicyError
    python bench/fuzz.py resolve [--seconds 60]   # arbitrary fields -> resolution or ContextError

The loader is seeded with the shipped policies. Any other exception is a crash: atheris prints
the input and exits non-zero. (`pip install atheris==3.0.0`; `make fuzz` runs both for a minute.)
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def main() -> int:
    parser = argparse.ArgumentParser(description="bounded atheris run over kvpolicy's loader or resolver")
    parser.add_argument("target", choices=("load", "resolve"))
    parser.add_argument("--seconds", type=int, default=60)
    args, rest = parser.parse_known_args()
    try:
        import atheris
    except ImportError:
        print("atheris is not installed: pip install atheris==3.0.0", file=sys.stderr)
        return 2

    with atheris.instrument_imports():
        import kvpolicy
        from kvpolicy.fuzzing import load_target, resolve_target
        from kvpolicy.read.loader import shipped_root

    corpus = Path(f".fuzz-corpus-{args.target}")
    corpus.mkdir(exist_ok=True)
    if args.target == "load":
        for path in shipped_root().glob("*.toml"):
            (corpus / path.name).write_bytes(path.read_bytes())

        def one(data: bytes) -> None:
            load_target(data)
    else:
        newest = kvpolicy.load()
        names = ["architecture", "backend", "transceiver_runtime", "kv_transfer_timeout_ms", "features",
                 "env", "kv_cache_manager", "enable_pipelined_transfer", "pretrained_config", "other"]

        def one(data: bytes) -> None:
            provider = atheris.FuzzedDataProvider(data)
            fields = {}
            for _ in range(provider.ConsumeIntInRange(0, 5)):
                name = names[provider.ConsumeIntInRange(0, len(names) - 1)]
                kind = provider.ConsumeIntInRange(0, 5)
                value = [
                    None,
                    provider.ConsumeUnicodeNoSurrogates(12),
                    provider.ConsumeInt(4),
                    [provider.ConsumeUnicodeNoSurrogates(8)],
                    {provider.ConsumeUnicodeNoSurrogates(6): provider.ConsumeUnicodeNoSurrogates(3)},
                    provider.ConsumeBool(),
                ][kind]
                fields[name] = value
            resolve_target(newest, None, fields)

    atheris.Setup([sys.argv[0], str(corpus), f"-max_total_time={args.seconds}", *rest], one)
    atheris.Fuzz()
    return 0


if __name__ == "__main__":
    sys.exit(main())
