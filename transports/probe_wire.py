"""The metadata probe's protocol: what its parent (:mod:`.probe`) and its helpers and children
(:mod:`.probe_child`) write to each other, on a helper's stdin and stdout or a spawned child's.

Both sides import it, and it imports nothing of theirs: a helper or child (started with ``python -m``
before the first probe it serves) imports this module, not the parent's :mod:`.probe`. A request is
:data:`REQUEST` and what follows it; a reply is :data:`REPLY` and its message; what each code means
to a caller is :class:`.probe_outcome.ProbeOutcome`.
"""

from __future__ import annotations

import struct

__all__ = [
    "CANNOT_RUN",
    "CLOSED",
    "ENDED",
    "MESSAGE_LIMIT",
    "OK",
    "PROBE",
    "PROVE",
    "REJECTED",
    "RELEASE",
    "RELEASED",
    "REPLY",
    "REQUEST",
    "SENT",
    "TIMED_OUT",
]

# What a child reports: its exit status (or the helper's reply code).
OK, REJECTED, CANNOT_RUN = 0, 10, 11
TIMED_OUT = 12  # (reply code only: the helper killed the child at its deadline)
CLOSED = 13  # (parent only: closed before the child answered)
RELEASED = 14  # (parent only: a proof released before its child answered)
ENDED = 15  # (reply code only, after a proof's OK: its lingering child is gone)

PROBE, PROVE, RELEASE = 1, 2, 3
"""Request kinds: load a blob; load it, send a notification and linger (fork mode); end a proof's child."""
REQUEST = struct.Struct("<BIddHHI")
"""kind, probe id, timeout_s, linger_s, agent name length, message length, blob length; then the agent
name, the message and the blob (a probe's name and message are empty; a release has nothing)."""
REPLY = struct.Struct("<IiI")  # probe id (0: helper start-up), code (<0: -signal), message length
MESSAGE_LIMIT = 1024
SENT = b"\0"
"""What a proving child writes on its result pipe once its notification is sent (a failure's message
never starts with it)."""
