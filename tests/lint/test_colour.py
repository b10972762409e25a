"""Colour in the text report: on a terminal or when asked, never in a pipe or a file, and the
same text once the colour codes are taken out."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

FIXTURE = str(Path(__file__).parent / "fixtures" / "KVP021.toml")
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def _lint(*args: str, env: dict[str, str] | None = None) -> str:
    environment = {k: v for k, v in os.environ.items() if k not in ("NO_COLOR", "FORCE_COLOR")}
    environment.update(env or {})
    done = subprocess.run(
        [sys.executable, "-m", "kvpolicy", "lint", *args, FIXTURE], capture_output=True, text=True, env=environment, timeout=120
    )
    assert done.returncode == 1, done.stderr
    return done.stdout


def test_a_pipe_gets_no_colour_and_always_colours_the_same_text():
    plain = _lint()
    assert "\x1b[" not in plain
    coloured = _lint("--color", "always")
    assert "\x1b[1;33mKVP021\x1b[0m" in coloured, "a warning's code is yellow"
    assert _ANSI.sub("", coloured) == plain


@pytest.mark.parametrize(
    ("args", "env", "coloured"),
    [
        ((), {"FORCE_COLOR": "1"}, True),
        ((), {"FORCE_COLOR": "1", "NO_COLOR": "1"}, False),
        (("--color", "never"), {"FORCE_COLOR": "1"}, False),
        (("--color", "always"), {"NO_COLOR": "1"}, True),
        (("--format", "json", "--color", "always"), {}, False),
    ],
)
def test_the_choice_then_no_color_then_force_color_decide(args, env, coloured):
    assert ("\x1b[" in _lint(*args, env=env)) is coloured


def test_a_terminal_gets_colour():
    pty = pytest.importorskip("pty")
    import select

    leader, follower = pty.openpty()
    environment = {k: v for k, v in os.environ.items() if k not in ("NO_COLOR", "FORCE_COLOR")}
    environment["TERM"] = "xterm"
    process = subprocess.Popen(
        [sys.executable, "-m", "kvpolicy", "lint", FIXTURE], stdout=follower, stderr=subprocess.DEVNULL, env=environment
    )
    os.close(follower)
    output = b""
    try:
        while select.select([leader], [], [], 60)[0]:
            try:
                chunk = os.read(leader, 65536)
            except OSError:
                break
            if not chunk:
                break
            output += chunk
    finally:
        process.wait(timeout=60)
        os.close(leader)
    assert b"\x1b[1;33mKVP021" in output
