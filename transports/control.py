"""The control plane's messages: msgpack frames, checked against a schema before anything trusts them.

A receiver says *hello* (its rank info, including its NIXL agent metadata), the sender answers
*welcome* (its own rank info); then the receiver sends *request* ("write these blocks of request X
into my blocks ..."), either side may send *cancel*, and the sender ends each request with a *result*
frame. Completion is always a result frame: a NIXL notification alone can be lost.

Reads (protocol 5): a sender that allows them puts its NIXL metadata in the welcome and announces
each offer naming a receiver to it (*offer*: its blocks and deadline). The receiver may then read the
blocks itself and answers every announcement with exactly one *release* (read, declined, cancelled
or failed); the sender keeps the blocks until then. See :mod:`.reads`.

A message is a msgpack array, ``[version, kind, field, ...]`` with the fields in their declared
order (a map's keys cost three times the decoding, on every request). Several requests, cancels or
results bound for one peer may travel in one frame, a *batch*: an array of at most
:data:`MAX_BATCH` messages, each checked exactly as a frame of its own (:func:`decode_many`). Hellos
and welcomes always travel alone.

Every attempt of a request carries a ``nonce`` chosen by the receiver; requests, cancels and results
name it, so a frame of one attempt never settles another. Every number is bounded here, at the
boundary, so that the code behind it works on values that cannot overflow an address or a count.
"""

from __future__ import annotations

import hashlib
import re
import threading
from typing import TYPE_CHECKING, Any, ClassVar, Literal, NamedTuple

import msgpack

from .rank import MAX_METADATA, MAX_NAME, MAX_POOL_BLOCKS, ControlMessageError, RankInfo, check_text

if TYPE_CHECKING:
    import zmq

__all__ = ["MAX_METADATA", "MAX_NAME", "MAX_POOL_BLOCKS", "ControlMessageError", "RankInfo"]

#: 2: bounded fields, nonces, deadlines (issue 11); 3: several messages per frame (batches, issue 13);
#: 4: positional messages, ``[version, kind, field, ...]`` (a third of a map's decoding, issue 13);
#: 5: offers and releases (receivers may read, issue 13); 6: timeouts as durations, not Unix
#: deadlines (each side measures them on its own monotonic clock), a cancel says whether it ends the
#: request or one attempt, and a receiver proves that the NIXL metadata of its hello is its own
#: (*proof*, issue 26); 7: the proof nonce is 128 random bits as 32 hex digits, not a count, and a
#: busy sender answers a hello with *refused* and a retry hint (issue 38); 8: before the nonce, the
#: sender sends the receiver its digest over the hello's CURVE session (*challenge*), and a receiver
#: echoes only the nonce that digest names (issue 38: another hello's nonce, sent to a receiver while
#: it waits for its own, no longer fails that receiver's proof).
PROTOCOL_VERSION = 8

#: Bounds for decoding: a frame larger than these is malformed, not a reason to allocate memory.
_MAX_FRAME = 16 << 20
_MAX_BLOCKS = 1 << 20
MAX_REASON = 2048
MAX_BATCH = 256
"""Most messages in one batch frame."""
BATCH_BYTES = 1 << 20
"""A sender of batches starts a new frame once this many bytes are queued (far below the 16 MiB bound)."""
_BATCHABLE = frozenset(("request", "cancel", "result", "offer", "release"))
MAX_TIMEOUT_MS = 86_400_000
"""Longest timeout a request or offer may carry (a day): beyond it a figure is forged, not chosen."""
_MAX_COUNT = 1 << 53
"""Bound of byte counts and microseconds in a result: beyond it a figure is forged, not measured."""

#: A proof nonce as it travels (in the NIXL notification and the echo): 32 lowercase hex digits. A
#: challenge's digest has the same form.
PROOF_NONCE = re.compile(r"[0-9a-f]{32}")


def nonce_digest(nonce: str) -> str:
    """What a :class:`Challenge` carries for ``nonce``: BLAKE2b of it, 16 bytes as 32 hex digits. The
    nonce is 128 random bits, so its digest tells nobody the nonce; it tells the receiver which nonce
    is the one its sender sent it."""
    return hashlib.blake2b(nonce.encode("ascii"), digest_size=16).hexdigest()


_INT_ONLY = frozenset((int,))  # issuperset(map(type, xs)): all exact ints, in C (no frame per item)


# Each message is a NamedTuple of its wire fields, subclassed (empty __slots__: no instance dict) to carry its class-level
# ``kind``: a NamedTuple's own body holds only fields and methods (an annotated ``kind`` would be a
# field, sent on the wire; a plain one is refused by type checkers).


class _HelloFields(NamedTuple):
    rank: RankInfo


class Hello(_HelloFields):
    """Receiver -> sender: who I am and where my blocks are."""

    __slots__ = ()
    kind: ClassVar[Literal["hello"]] = "hello"


class _WelcomeFields(NamedTuple):
    rank: RankInfo


class Welcome(_WelcomeFields):
    """Sender -> receiver: the answer to :class:`Hello`."""

    __slots__ = ()
    kind: ClassVar[Literal["welcome"]] = "welcome"


class _RequestFields(NamedTuple):
    request_id: str
    nonce: int
    """This attempt, chosen by the receiver; results and cancels name it."""
    blocks: tuple[int, ...]
    skip_blocks: int
    timeout_ms: int
    """Time left to the receiver when it sent this (ms). The sender counts it from when it read the
    frame, on its own monotonic clock: no wall clock is compared across hosts. The receiver's blocks
    stay fenced until the sender's result, so a sender that starts later than the receiver expects
    (the frame's transit) never writes into memory given to another request."""


class Request(_RequestFields):
    """Receiver -> sender: write the blocks of ``request_id`` (after the first ``skip_blocks``) into
    my ``blocks``."""

    __slots__ = ()
    kind: ClassVar[Literal["request"]] = "request"


class _CancelFields(NamedTuple):
    request_id: str
    nonce: int = 0
    final: int = 1
    """1: the receiver gives the request up (``cancel()``), so the sender need not wait for it;
    0: only this attempt ends (it timed out) and a retry may still ask."""


class Cancel(_CancelFields):
    """Either side: stop attempt ``nonce`` of ``request_id`` (0: every attempt of this peer)."""

    __slots__ = ()
    kind: ClassVar[Literal["cancel"]] = "cancel"


class _ResultFields(NamedTuple):
    request_id: str
    nonce: int
    status: str
    """``"ok"``, ``"error"``, ``"cancelled"`` (nothing written) or ``"aborted"`` (a write was stopped:
    the blocks hold partial data). Whatever the status, no write of this attempt follows it."""
    reason: str = ""
    nbytes: int = 0
    descriptors_before: int = 0
    descriptors: int = 0
    queue_us: int = 0
    transfer_us: int = 0


class Result(_ResultFields):
    """Sender -> receiver: how ``request_id`` ended for this receiver. The only completion signal."""

    __slots__ = ()
    kind: ClassVar[Literal["result"]] = "result"


class _OfferFields(NamedTuple):
    request_id: str
    token: int
    """This offer, chosen by the sender; the release names it."""
    blocks: tuple[int, ...]
    """The sender's block ids, all of the request's blocks."""
    timeout_ms: int
    """Time left to the offer when it was sent (ms), counted by the receiver from when it read the
    frame on its own monotonic clock; no read starts after it."""


class Offer(_OfferFields):
    """Sender -> receiver (reads only): the blocks of ``request_id`` may be read for ``timeout_ms``."""

    __slots__ = ()
    kind: ClassVar[Literal["offer"]] = "offer"


class _ReleaseFields(NamedTuple):
    request_id: str
    token: int
    status: str
    """``"ok"`` (read), ``"declined"`` (nothing read: the receive asked for a write, or the offer
    expired, was cancelled by the sender or was over budget), ``"cancelled"`` (the receive was
    cancelled or timed out) or ``"error"`` (the read failed)."""
    reason: str = ""
    nbytes: int = 0
    transfer_us: int = 0


class Release(_ReleaseFields):
    """Receiver -> sender (reads only): the one answer to an :class:`Offer`; no read of it follows."""

    __slots__ = ()
    kind: ClassVar[Literal["release"]] = "release"


class _RefusedFields(NamedTuple):
    reason: str
    retry_after_ms: int


class Refused(_RefusedFields):
    """Sender -> receiver, instead of a welcome: the hello was turned away for now (the sender's
    metadata probe is full, its key has as many hellos in flight or per second as it may, or metadata
    reads are), so the receiver's connect fails at once with the reason and a retry hint instead of
    waiting for its timeout. Only ``busy`` refusals are answered: a hello refused for what it is (a
    wrong agent name, metadata that failed the probe) gets silence."""

    __slots__ = ()
    kind: ClassVar[Literal["refused"]] = "refused"


class _ProofFields(NamedTuple):
    nonce: str


class Proof(_ProofFields):
    """Receiver -> sender, before the welcome: the nonce the sender sent as a NIXL notification to
    the agent of the hello's metadata. Only the process that owns that agent receives it, so a peer
    that says hello with another peer's metadata (renamed to its own agent) cannot answer. The nonce
    is 128 bits from the OS's CSPRNG as 32 hex digits, fresh for each hello and good for one echo."""

    __slots__ = ()
    kind: ClassVar[Literal["proof"]] = "proof"


class _ChallengeFields(NamedTuple):
    digest: str


class Challenge(_ChallengeFields):
    """Sender -> receiver, before the welcome, sent before the nonce itself: the digest of the nonce
    (:func:`nonce_digest`) this sender is sending as a NIXL notification to the agent of the hello's
    metadata. The receiver echoes only a nonce with this digest: any other nonce that reaches it
    while it waits (another peer's hello naming its agent, by an insider who copied its metadata)
    would otherwise be echoed and fail its own proof. It travels on the hello's CURVE session, so
    only that receiver sees it."""

    __slots__ = ()
    kind: ClassVar[Literal["challenge"]] = "challenge"


Message = Hello | Welcome | Request | Cancel | Result | Offer | Release | Proof | Refused | Challenge

RESULT_STATUSES = ("ok", "error", "cancelled", "aborted")
RELEASE_STATUSES = ("ok", "declined", "cancelled", "error")

_SCHEMAS: dict[str, tuple[type, tuple[tuple[str, type], ...]]] = {
    "hello": (Hello, (("rank", dict),)),
    "welcome": (Welcome, (("rank", dict),)),
    "request": (Request, (("request_id", str), ("nonce", int), ("blocks", list), ("skip_blocks", int), ("timeout_ms", int))),
    "cancel": (Cancel, (("request_id", str), ("nonce", int), ("final", int))),
    "result": (
        Result,
        (
            ("request_id", str),
            ("nonce", int),
            ("status", str),
            ("reason", str),
            ("nbytes", int),
            ("descriptors_before", int),
            ("descriptors", int),
            ("queue_us", int),
            ("transfer_us", int),
        ),
    ),
    "offer": (Offer, (("request_id", str), ("token", int), ("blocks", list), ("timeout_ms", int))),
    "release": (Release, (("request_id", str), ("token", int), ("status", str), ("reason", str), ("nbytes", int), ("transfer_us", int))),
    "proof": (Proof, (("nonce", str),)),
    "challenge": (Challenge, (("digest", str),)),
    "refused": (Refused, (("reason", str), ("retry_after_ms", int))),
}
"""Each kind's class and its fields, in wire order, with their types."""


def encode(message: Message) -> bytes:
    """Serialise one message: ``[version, kind, field, ...]``, the fields in their declared order."""
    if type(message) is Hello or type(message) is Welcome:
        return _packer().pack((PROTOCOL_VERSION, message.kind, message.rank.to_wire()))
    return _packer().pack((PROTOCOL_VERSION, message.kind, *message))


_packers = threading.local()


def _packer() -> msgpack.Packer:
    """This thread's packer: ``packb`` builds one per call, which costs twice the packing."""
    try:
        return _packers.packer
    except AttributeError:
        packer = _packers.packer = msgpack.Packer(use_bin_type=True)
        return packer


def frame_spans(parts: list[bytes]) -> list[tuple[int, int]]:
    """Where :func:`frames` cuts ``parts``: ``(start, end)`` of each frame's messages."""
    spans, start, size = [], 0, 0
    for i, part in enumerate(parts):
        if i > start and (i - start == MAX_BATCH or size + len(part) > BATCH_BYTES):
            spans.append((start, i))
            start, size = i, 0
        size += len(part)
    spans.append((start, len(parts)))
    return spans


def frames(parts: list[bytes]) -> list[bytes]:
    """Encoded messages for one peer, in order, as few frames as the bounds allow."""
    return [batch(parts[start:end]) for start, end in frame_spans(parts)]


def batch(parts: list[bytes]) -> bytes:
    """One frame carrying the already encoded messages ``parts`` (1 to :data:`MAX_BATCH`; a single
    message goes as itself). A msgpack array is its header followed by its items, so nothing is
    encoded twice."""
    n = len(parts)
    if n == 1:
        return parts[0]
    if not 1 < n <= MAX_BATCH:
        raise ValueError(f"a batch holds 1..{MAX_BATCH} messages, got {n}")
    header = bytes((0x90 | n,)) if n < 16 else b"\xdc" + n.to_bytes(2, "big")
    return header + b"".join(parts)


def _unpack(frame: Any) -> Any:
    """The frame's msgpack value; a frame that does not parse is looked at again, for the reason."""
    error: Exception | None = None
    try:
        if len(frame) <= _MAX_FRAME:
            return msgpack.unpackb(frame, raw=False, strict_map_key=True, max_array_len=_MAX_BLOCKS, max_bin_len=_MAX_FRAME)
    except Exception as exc:  # msgpack raises several unrelated types for garbage input
        error = exc
    try:
        size = memoryview(frame).nbytes  # bytes, or anything holding them (a zmq.Frame)
    except TypeError:
        raise ControlMessageError("frame is not bytes") from None
    if size > _MAX_FRAME:
        raise ControlMessageError(f"frame of {size} bytes is too large (at most {_MAX_FRAME})")
    raise ControlMessageError(f"not a msgpack frame: {type(error).__name__}")


def decode(frame: bytes) -> Message:
    """Parse and schema-check one frame; raises :class:`ControlMessageError` for anything off-schema."""
    return _check_body(_unpack(frame))


def decode_many(frame: bytes | zmq.Frame) -> list[Message]:
    """Parse a frame holding one message or a batch of them; every message is checked as
    :func:`decode` checks a frame. Any message off-schema refuses the whole frame."""
    body = _unpack(frame)
    if type(body) is list and body:
        first = body[0]
        if first == PROTOCOL_VERSION and type(first) is int:  # one message (the usual frame)
            kind = body[1] if len(body) > 1 else None
            message = _request_fast(body) if kind == "request" else _result_fast(body) if kind == "result" else None
            return [message if message is not None else _check_body(body)]
        if type(first) is list:
            return _check_batch(body)
    return [_check_body(body)]


def _check_batch(body: list[Any]) -> list[Message]:
    if not 1 < len(body) <= MAX_BATCH:
        raise ControlMessageError(f"batch of {len(body)} messages, not 2..{MAX_BATCH}")
    messages: list[Message] = []
    for i, item in enumerate(body):
        if type(item) is not list or len(item) < 2 or type(item[1]) is not str or item[1] not in _BATCHABLE:
            raise ControlMessageError(f"batch[{i}]: only requests, cancels, results, offers and releases travel in batches")
        kind = item[1]
        message: Message | None = _request_fast(item) if kind == "request" else _result_fast(item) if kind == "result" else None
        if message is None or item[0] != PROTOCOL_VERSION or type(item[0]) is not int:
            try:
                message = _check_body(item)
            except ControlMessageError as exc:
                raise ControlMessageError(f"batch[{i}]: {exc}") from None
        messages.append(message)
    return messages


def _check_body(body: Any) -> Message:
    """The full check of one message, field by field: every refusal names what is wrong."""
    if isinstance(body, dict) and "v" in body:  # protocol 1 to 3 sent maps
        version = body["v"]
        raise ControlMessageError(
            f"unsupported protocol version {version!r} (this side speaks {PROTOCOL_VERSION}); upgrade both sides of the connection to the same kvpolicy release"
        )
    if type(body) is not list or len(body) < 2:
        raise ControlMessageError("frame is not a message: expected an array [version, kind, fields...]")
    version, kind, values = body[0], body[1], body[2:]
    if type(version) is list:
        raise ControlMessageError("a batch of messages where one message was expected")
    if type(version) is not int or version != PROTOCOL_VERSION:
        raise ControlMessageError(
            f"unsupported protocol version {version!r} (this side speaks {PROTOCOL_VERSION}); upgrade both sides of the connection to the same kvpolicy release"
        )
    if type(kind) is not str or kind not in _SCHEMAS:
        raise ControlMessageError(f"unknown message kind {kind!r}")
    cls, schema = _SCHEMAS[kind]
    if len(values) != len(schema):
        names = ", ".join(name for name, _ in schema)
        raise ControlMessageError(f"{kind}: expected {len(schema)} fields ({names}), got {len(values)}")
    data: dict[str, Any] = {}
    for (key, expected), value in zip(schema, values):
        # bool is an int subclass; a boolean where a count belongs is a foreign or broken sender.
        if isinstance(value, bool) or not isinstance(value, expected):
            raise ControlMessageError(f"{kind}.{key}: expected {expected.__name__}, got {type(value).__name__}")
        data[key] = value
    if kind in ("hello", "welcome"):
        return cls(RankInfo.from_wire(data["rank"]))
    if kind == "proof":
        if not PROOF_NONCE.fullmatch(data["nonce"]):
            raise ControlMessageError("proof.nonce is not 32 lowercase hex digits")
        return cls(**data)
    if kind == "challenge":
        if not PROOF_NONCE.fullmatch(data["digest"]):
            raise ControlMessageError("challenge.digest is not 32 lowercase hex digits")
        return cls(**data)
    if kind == "refused":
        check_text("refused.reason", data["reason"], 500)
        if not 0 < data["retry_after_ms"] <= 600_000:
            raise ControlMessageError(f"refused.retry_after_ms {data['retry_after_ms']} out of range")
        return cls(**data)
    check_text(f"{kind}.request_id", data["request_id"])
    nonce = "token" if kind in ("offer", "release") else "nonce"
    if not 0 <= data[nonce] < _MAX_COUNT or (kind != "cancel" and data[nonce] == 0):
        raise ControlMessageError(f"{kind}.{nonce} {data[nonce]} out of range")
    if kind in ("request", "offer"):
        blocks = data["blocks"]
        if not all(type(b) is int and 0 <= b < MAX_POOL_BLOCKS for b in blocks):
            raise ControlMessageError(f"{kind}.blocks: expected ints in 0..{MAX_POOL_BLOCKS - 1}")
        if not 0 <= data.get("skip_blocks", 0) < MAX_POOL_BLOCKS or not 0 < data["timeout_ms"] <= MAX_TIMEOUT_MS:
            raise ControlMessageError(f"{kind}: skip_blocks or timeout_ms out of range (timeout_ms 1..{MAX_TIMEOUT_MS})")
        data["blocks"] = tuple(blocks)
    elif kind == "cancel" and data["final"] not in (0, 1):
        raise ControlMessageError(f"cancel.final {data['final']} is not 0 or 1")
    elif kind in ("result", "release"):
        statuses = RESULT_STATUSES if kind == "result" else RELEASE_STATUSES
        if data["status"] not in statuses:
            raise ControlMessageError(f"{kind}.status {data['status']!r} not in {statuses}")
        if len(data["reason"]) > MAX_REASON:
            raise ControlMessageError(f"{kind}.reason longer than {MAX_REASON} characters")
        for key, value in data.items():
            if key not in ("request_id", "nonce", "token", "status", "reason") and not 0 <= value < _MAX_COUNT:
                raise ControlMessageError(f"{kind}.{key} {value} out of range")
    return cls(**data)


def _request_fast(body: list[Any]) -> Request | None:
    """A well-formed request (version and kind checked), in one expression: the per-request path.
    It accepts a subset of what the full check does; anything else (None) takes the full check,
    which words the error."""
    if len(body) != 7:
        return None
    _, _, rid, nonce, blocks, skip, timeout = body
    if (
        type(rid) is str
        and 0 < len(rid) <= MAX_NAME
        and type(nonce) is int
        and 0 < nonce < _MAX_COUNT
        and type(blocks) is list
        and type(skip) is int
        and 0 <= skip < MAX_POOL_BLOCKS
        and type(timeout) is int
        and 0 < timeout <= MAX_TIMEOUT_MS
        and (not blocks or (_INT_ONLY.issuperset(map(type, blocks)) and min(blocks) >= 0 and max(blocks) < MAX_POOL_BLOCKS))
    ):
        return Request(rid, nonce, tuple(blocks), skip, timeout)
    return None


def _result_fast(body: list[Any]) -> Result | None:
    """A well-formed result, as :func:`_request_fast` checks a request."""
    if len(body) != 11:
        return None
    _, _, rid, nonce, status, reason, nbytes, before, descriptors, queue_us, transfer_us = body
    if (
        type(rid) is str
        and 0 < len(rid) <= MAX_NAME
        and type(nonce) is int
        and 0 < nonce < _MAX_COUNT
        and type(status) is str
        and status in RESULT_STATUSES
        and type(reason) is str
        and len(reason) <= MAX_REASON
        and type(nbytes) is int
        and 0 <= nbytes < _MAX_COUNT
        and type(before) is int
        and 0 <= before < _MAX_COUNT
        and type(descriptors) is int
        and 0 <= descriptors < _MAX_COUNT
        and type(queue_us) is int
        and 0 <= queue_us < _MAX_COUNT
        and type(transfer_us) is int
        and 0 <= transfer_us < _MAX_COUNT
    ):
        return Result(rid, nonce, status, reason, nbytes, before, descriptors, queue_us, transfer_us)
    return None
