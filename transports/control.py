"""The control plane's messages: msgpack frames, checked against a schema before anything trusts them.

A receiver says *hello* (its rank info, including its NIXL agent metadata), the sender answers
*welcome* (its own rank info); then the receiver sends *request* ("write these blocks of request X
into my blocks ..."), either side may send *cancel*, and the sender ends each request with a *result*
frame. Completion is always a result frame: a NIXL notification alone can be lost.

Several requests, cancels or results bound for one peer may travel in one frame, a *batch*: a
msgpack array of at most :data:`MAX_BATCH` message maps, each checked exactly as a frame of its own
(:func:`decode_many`). Hellos and welcomes always travel alone.

Every attempt of a request carries a ``nonce`` chosen by the receiver; requests, cancels and results
name it, so a frame of one attempt never settles another. Every number is bounded here, at the
boundary, so that the code behind it works on values that cannot overflow an address or a count.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any, ClassVar, Union

import msgpack

from .layout import KVLayout

#: 2: bounded fields, nonces, deadlines (issue 11); 3: several messages per frame (batches, issue 13).
PROTOCOL_VERSION = 3

#: Bounds for decoding: a frame larger than these is malformed, not a reason to allocate memory.
_MAX_FRAME = 16 << 20
_MAX_BLOCKS = 1 << 20
MAX_METADATA = 1 << 20
"""Largest NIXL agent metadata accepted in a hello (a UCX agent's is a few KiB)."""
MAX_NAME = 256
"""Longest transceiver name, agent name, request id."""
MAX_REASON = 2048
MAX_POOL_BLOCKS = 1 << 24
"""Largest pool a peer may declare; a sender may lower it (``max_peer_blocks``)."""
_MAX_LAYOUT_FIELD = 1 << 16
_ADDRESS_SPACE = 1 << 64
MAX_BATCH = 256
"""Most messages in one batch frame."""
BATCH_BYTES = 1 << 20
"""A sender of batches starts a new frame once this many bytes are queued (frames stay far below
the 16 MiB bound even when single requests carry many blocks)."""
_BATCHABLE = frozenset(("request", "cancel", "result"))
_MAX_COUNT = 1 << 53
"""Bound of byte counts and microseconds in a result: beyond it a figure is forged, not measured."""


class ControlMessageError(ValueError):
    """A control frame that does not match the schema. It is dropped and counted, never acted on."""


@dataclass(frozen=True)
class RankInfo:
    """What one side tells the other about itself when they connect."""

    name: str
    """Transceiver name, for logs."""
    agent: str
    """NIXL agent name."""
    metadata: bytes
    """NIXL agent metadata (empty when the peer need not write to this side)."""
    layout: KVLayout
    base_address: int
    num_blocks: int
    memory_type: str
    device_id: int

    def to_wire(self) -> dict[str, Any]:
        data = asdict(self)
        data["layout"] = self.layout.to_wire()
        return data

    @classmethod
    def from_wire(cls, data: Any) -> RankInfo:
        _check_fields("rank", data, _RANK_FIELDS)
        try:
            layout = KVLayout.from_wire(data["layout"])
        except ValueError as exc:
            raise ControlMessageError(f"rank.layout: {exc}") from None
        for key, value in data["layout"].items():
            if isinstance(value, int) and not 0 <= value < _MAX_LAYOUT_FIELD:
                raise ControlMessageError(f"rank.layout.{key} {value} out of range")
        if data["memory_type"] not in ("DRAM", "VRAM"):
            raise ControlMessageError(f"rank.memory_type {data['memory_type']!r} is not DRAM or VRAM")
        _check_text("rank.name", data["name"])
        _check_text("rank.agent", data["agent"])
        if len(data["metadata"]) > MAX_METADATA:
            raise ControlMessageError(f"rank.metadata: {len(data['metadata'])} bytes, more than {MAX_METADATA}")
        if not 0 < data["num_blocks"] <= MAX_POOL_BLOCKS:
            raise ControlMessageError(f"rank.num_blocks {data['num_blocks']} not in 1..{MAX_POOL_BLOCKS}")
        if not 0 <= data["device_id"] < _MAX_LAYOUT_FIELD:
            raise ControlMessageError(f"rank.device_id {data['device_id']} out of range")
        end = data["base_address"] + data["num_blocks"] * layout.block_bytes
        if data["base_address"] <= 0 or end > _ADDRESS_SPACE:
            raise ControlMessageError("rank: the pool [base_address, + num_blocks * block_bytes) is not in the address space")
        return cls(**{**data, "layout": layout})


_RANK_FIELDS: dict[str, type | tuple[type, ...]] = {
    "name": str,
    "agent": str,
    "metadata": bytes,
    "layout": dict,
    "base_address": int,
    "num_blocks": int,
    "memory_type": str,
    "device_id": int,
}


@dataclass(frozen=True)
class Hello:
    """Receiver -> sender: who I am and where my blocks are."""

    kind: ClassVar[str] = "hello"
    rank: RankInfo


@dataclass(frozen=True)
class Welcome:
    """Sender -> receiver: the answer to :class:`Hello`."""

    kind: ClassVar[str] = "welcome"
    rank: RankInfo


@dataclass(frozen=True)
class Request:
    """Receiver -> sender: write the blocks of ``request_id`` (after the first ``skip_blocks``) into
    my ``blocks``."""

    kind: ClassVar[str] = "request"
    request_id: str
    nonce: int
    """This attempt, chosen by the receiver; results and cancels name it."""
    blocks: tuple[int, ...]
    skip_blocks: int
    deadline_ms: int
    """Absolute deadline (Unix time, ms): no write may start after it."""


@dataclass(frozen=True)
class Cancel:
    """Either side: stop attempt ``nonce`` of ``request_id`` (0: every attempt of this peer)."""

    kind: ClassVar[str] = "cancel"
    request_id: str
    nonce: int = 0


@dataclass(frozen=True)
class Result:
    """Sender -> receiver: how ``request_id`` ended for this receiver. The only completion signal."""

    kind: ClassVar[str] = "result"
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


Message = Union[Hello, Welcome, Request, Cancel, Result]

RESULT_STATUSES = ("ok", "error", "cancelled", "aborted")

_SCHEMAS: dict[str, tuple[type, dict[str, type | tuple[type, ...]]]] = {
    "hello": (Hello, {"rank": dict}),
    "welcome": (Welcome, {"rank": dict}),
    "request": (
        Request,
        {"request_id": str, "nonce": int, "blocks": list, "skip_blocks": int, "deadline_ms": int},
    ),
    "cancel": (Cancel, {"request_id": str, "nonce": int}),
    "result": (
        Result,
        {
            "request_id": str,
            "nonce": int,
            "status": str,
            "reason": str,
            "nbytes": int,
            "descriptors_before": int,
            "descriptors": int,
            "queue_us": int,
            "transfer_us": int,
        },
    ),
}


def _check_fields(where: str, data: Any, schema: dict[str, type | tuple[type, ...]]) -> None:
    if not isinstance(data, dict):
        raise ControlMessageError(f"{where}: expected a map, got {type(data).__name__}")
    if set(data) != set(schema):
        missing = sorted(set(schema) - set(data))
        extra = sorted(map(str, set(data) - set(schema)))
        raise ControlMessageError(f"{where}: missing fields {missing}, unexpected fields {extra}")
    for key, expected in schema.items():
        value = data[key]
        # bool is an int subclass; a boolean where a count belongs is a foreign or broken sender.
        if isinstance(value, bool) or not isinstance(value, expected):
            raise ControlMessageError(f"{where}.{key}: expected {expected}, got {type(value).__name__}")


def _check_text(where: str, value: str, limit: int = MAX_NAME) -> None:
    if not value or len(value) > limit:
        raise ControlMessageError(f"{where}: empty or longer than {limit} characters")


def encode(message: Message) -> bytes:
    """Serialise one message to a msgpack frame."""
    # The two messages of every request, spelled out: walking dataclass fields costs more than packing.
    if type(message) is Request:
        return _packb({
            "v": PROTOCOL_VERSION, "kind": "request", "request_id": message.request_id, "nonce": message.nonce,
            "blocks": list(message.blocks), "skip_blocks": message.skip_blocks, "deadline_ms": message.deadline_ms,
        })
    if type(message) is Result:
        m = message
        return _packb({
            "v": PROTOCOL_VERSION, "kind": "result", "request_id": m.request_id, "nonce": m.nonce, "status": m.status,
            "reason": m.reason, "nbytes": m.nbytes, "descriptors_before": m.descriptors_before,
            "descriptors": m.descriptors, "queue_us": m.queue_us, "transfer_us": m.transfer_us,
        })
    body: dict[str, Any] = {"v": PROTOCOL_VERSION, "kind": message.kind}
    for f in fields(message):
        value = getattr(message, f.name)
        if isinstance(value, RankInfo):
            value = value.to_wire()
        elif isinstance(value, tuple):
            value = list(value)
        body[f.name] = value
    return msgpack.packb(body, use_bin_type=True)


def _packb(body: dict[str, Any]) -> bytes:
    return msgpack.packb(body, use_bin_type=True)


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


def _unpack(frame: bytes) -> Any:
    if not isinstance(frame, (bytes, bytearray, memoryview)) or len(frame) > _MAX_FRAME:
        raise ControlMessageError("frame is not bytes or is too large")
    try:
        return msgpack.unpackb(
            frame, raw=False, strict_map_key=True, max_array_len=_MAX_BLOCKS, max_bin_len=_MAX_FRAME
        )
    except Exception as exc:  # msgpack raises several unrelated types for garbage input
        raise ControlMessageError(f"not a msgpack frame: {type(exc).__name__}") from None


def decode(frame: bytes) -> Message:
    """Parse and schema-check one frame; raises :class:`ControlMessageError` for anything off-schema."""
    return _check_body(_unpack(frame))


def decode_many(frame: bytes) -> list[Message]:
    """Parse a frame holding one message or a batch of them; every message is checked as
    :func:`decode` checks a frame. Any message off-schema refuses the whole frame."""
    body = _unpack(frame)
    if not isinstance(body, list):
        return [_check_body(body)]
    if not 1 < len(body) <= MAX_BATCH:
        raise ControlMessageError(f"batch of {len(body)} messages, not 2..{MAX_BATCH}")
    messages = []
    for i, item in enumerate(body):
        if not isinstance(item, dict) or item.get("kind") not in _BATCHABLE:
            raise ControlMessageError(f"batch[{i}]: only requests, cancels and results travel in batches")
        try:
            messages.append(_check_body(item))
        except ControlMessageError as exc:
            raise ControlMessageError(f"batch[{i}]: {exc}") from None
    return messages


def _check_body(body: Any) -> Message:
    if not isinstance(body, dict):
        raise ControlMessageError("frame is not a map")
    if body.get("v") != PROTOCOL_VERSION:
        raise ControlMessageError(
            f"unsupported protocol version {body.get('v')!r} (this side speaks {PROTOCOL_VERSION}); "
            "upgrade both sides of the connection to the same kvpolicy release"
        )
    kind = body.get("kind")
    if kind not in _SCHEMAS:
        raise ControlMessageError(f"unknown message kind {kind!r}")
    if kind == "request" or kind == "result":
        fast = (_request_fast if kind == "request" else _result_fast)(body)
        if fast is not None:
            return fast
    cls, schema = _SCHEMAS[kind]
    data = {k: v for k, v in body.items() if k not in ("v", "kind")}
    _check_fields(kind, data, schema)
    if kind in ("hello", "welcome"):
        data["rank"] = RankInfo.from_wire(data["rank"])
        return cls(**data)
    _check_text(f"{kind}.request_id", data["request_id"])
    if not 0 <= data["nonce"] < _MAX_COUNT or (kind != "cancel" and data["nonce"] == 0):
        raise ControlMessageError(f"{kind}.nonce {data['nonce']} out of range")
    if kind == "request":
        blocks = data["blocks"]
        if not all(type(b) is int and 0 <= b < MAX_POOL_BLOCKS for b in blocks):
            raise ControlMessageError(f"request.blocks: expected ints in 0..{MAX_POOL_BLOCKS - 1}")
        if not 0 <= data["skip_blocks"] < MAX_POOL_BLOCKS or not 0 < data["deadline_ms"] < _MAX_COUNT:
            raise ControlMessageError("request: skip_blocks or deadline_ms out of range")
        data["blocks"] = tuple(blocks)
    elif kind == "result":
        if data["status"] not in RESULT_STATUSES:
            raise ControlMessageError(f"result.status {data['status']!r} not in {RESULT_STATUSES}")
        if len(data["reason"]) > MAX_REASON:
            raise ControlMessageError(f"result.reason longer than {MAX_REASON} characters")
        for key in ("nbytes", "descriptors_before", "descriptors", "queue_us", "transfer_us"):
            if not 0 <= data[key] < _MAX_COUNT:
                raise ControlMessageError(f"result.{key} {data[key]} out of range")
    return cls(**data)


def _request_fast(body: dict[str, Any]) -> Request | None:
    """A well-formed request (``v`` and ``kind`` checked), checked in one expression: the per-request
    path. It accepts a subset of what the full check does; anything else (None) takes the full
    check, which words the error. Seven keys, five of them present with these exact types, leave
    no room for an extra field."""
    get = body.get
    rid, nonce, blocks, skip, deadline = get("request_id"), get("nonce"), get("blocks"), get("skip_blocks"), get("deadline_ms")
    if (
        len(body) == 7 and type(rid) is str and 0 < len(rid) <= MAX_NAME and type(nonce) is int and 0 < nonce < _MAX_COUNT
        and type(blocks) is list and type(skip) is int and 0 <= skip < MAX_POOL_BLOCKS
        and type(deadline) is int and 0 < deadline < _MAX_COUNT
        and (not blocks or (all(type(b) is int for b in blocks) and min(blocks) >= 0 and max(blocks) < MAX_POOL_BLOCKS))
    ):
        return Request(rid, nonce, tuple(blocks), skip, deadline)
    return None


_RESULT_COUNTS = ("nbytes", "descriptors_before", "descriptors", "queue_us", "transfer_us")


def _result_fast(body: dict[str, Any]) -> Result | None:
    """A well-formed result, as :func:`_request_fast` checks a request."""
    get = body.get
    rid, nonce, status, reason = get("request_id"), get("nonce"), get("status"), get("reason")
    counts = [get(k) for k in _RESULT_COUNTS]
    if (
        len(body) == 11 and type(rid) is str and 0 < len(rid) <= MAX_NAME and type(nonce) is int and 0 < nonce < _MAX_COUNT
        and type(status) is str and status in RESULT_STATUSES and type(reason) is str and len(reason) <= MAX_REASON
        and all(type(c) is int and 0 <= c < _MAX_COUNT for c in counts)
    ):
        return Result(rid, nonce, status, reason, *counts)
    return None
