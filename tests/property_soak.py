"""The property tests with fresh random draws, round after round, for a bounded time (``make fuzz-properties``).

    python -m tests.property_soak [--minutes 30] [PYTEST_ARGS...]

The gate (``make test``, CI) runs hypothesis derandomised, so the same commit always draws the same
examples. This runner is the other half, kept out of the gate: each round picks a new seed, prints
it, and runs every ``@given`` test under the ``random`` profile. On a failure it stops and prints the
command that replays that round (the seed, and hypothesis's own ``@reproduce_failure`` blob in the
output). No round starts after the time is up, and each round is bounded too.
"""

from __future__ import annotations

import argparse
import os
import secrets
import subprocess
import sys
import time

#: The folders whose property tests are cheap enough to repeat (reading policies, evaluating them,
#: lint, comparing versions); transports' own property tests start processes and run in the gate only.
FOLDERS = ("tests/read", "tests/evaluate", "tests/lint", "tests/analyse")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=30.0)
    args, pytest_args = parser.parse_known_args(argv)
    deadline = time.monotonic() + args.minutes * 60
    env = {**os.environ, "KVPOLICY_HYPOTHESIS": "random"}
    rounds = 0
    while time.monotonic() < deadline:
        seed = secrets.randbelow(2**32)
        command = [sys.executable, "-m", "pytest", "-q", "-x", "-m", "hypothesis", "-p", "no:cacheprovider",
                   f"--hypothesis-seed={seed}", *FOLDERS, *pytest_args]
        print(f"round {rounds + 1}: seed {seed}", flush=True)
        left = max(60.0, deadline - time.monotonic() + 600)
        try:
            result = subprocess.run(command, env=env, timeout=left)
        except subprocess.TimeoutExpired:
            print(f"round {rounds + 1} (seed {seed}) did not finish in {left:.0f} s", file=sys.stderr)
            return 1
        if result.returncode != 0:
            print(f"\nproperty failed in round {rounds + 1}; replay it with:\n"
                  f"  KVPOLICY_HYPOTHESIS=random {' '.join(command[1:])}", file=sys.stderr)
            return 1
        rounds += 1
    print(f"{rounds} rounds of fresh draws, no failure ({args.minutes:g} min)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
