"""Sender side admission: from a receiver's hello to its welcome.

A hello is bounded per key (hellos per second, hellos in flight), checked (its pool, its agent name
bound to its key, its layout), its NIXL metadata read strictly (:mod:`.metadata`), probed in a
short-lived child (:mod:`.probe`) and proved: a fresh nonce goes as a NIXL notification to the agent
that metadata describes, after its digest went to the hello's connection (``challenge``), and only
the receiver that echoes it (``proof``) is welcomed, by :meth:`.peers.Remotes.welcome`. A key whose
proof fails, or whose metadata crashed a probe, waits. docs/trust-model.md says why each step is
there. Runs on the service thread.
"""

from __future__ import annotations

import logging
import os
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import zmq

from . import control
from .addresses import agent_carries_key, fingerprint
from .etcd_client import EtcdClient, RegistryError
from .discovery import nixl_metadata_key
from .local import PROOF_PREFIX, Bucket, LocalSide, agent_of_metadata
from .mapping import BlockSegments, block_segments


log = logging.getLogger("kvpolicy.transports")

_REFETCH_S = 0.25
"""How often a hello's metadata is read again from etcd while it is not there yet."""
CRASH_BAN_S = 60.0
"""How long a key whose hello's metadata crashed the probe child is refused."""
PROOF_S = 5.0
"""Longest a receiver may take to echo the proof nonce (less if the transceiver's timeout is)."""
BUSY_RETRY_MS = 500
"""The retry hint a busy sender gives (a probe takes ~50-700 ms here)."""


@dataclass
class Proving:
    """A hello waiting for the receiver to echo the nonce sent as a NIXL notification to the agent its
    metadata describes: from a probe child (``release`` ends it; the metadata is loaded here only
    after the echo), or, for metadata loaded here already, from this side's own agent."""

    identity: bytes
    key: bytes
    rank: control.RankInfo
    segments: BlockSegments
    stale: list
    nonce: str
    timer: Any = None
    started: float = field(default_factory=time.monotonic)
    blob: bytes = b""
    release: Callable[[], None] | None = None
    """(Sent by a probe child) ends that child; None when this side's agent sent the nonce."""


def _nothing() -> None:
    pass


@dataclass(eq=False)
class _Sending:
    """A hello whose metadata a probe child is loading, to send the proof nonce from there."""

    identity: bytes
    key: bytes
    release: Callable[[], None] = _nothing
    """Ends that child (see :meth:`.probe.MetadataProbe.prove`)."""
    echo: str | None = None
    """The first proof echo that came on its connection before the child's report did (the nonce can
    reach the receiver, and its echo come back, before the report reaches this loop): judged as the
    first echo once the proving starts."""


class Peers(Protocol):
    """What admission uses of the sender's receivers (:class:`.peers.Remotes`)."""

    router: zmq.Socket
    """The ROUTER socket hellos came on (challenges and busy answers go back on it)."""

    def forget_stale(self, identity: bytes, key: bytes, rank: control.RankInfo) -> list[Any]: ...

    def welcome(self, proving: Proving) -> None: ...


class Admission:
    """The hellos a sender's ROUTER received and has not yet welcomed or refused, by connection,
    and what it remembers of each key (bans, hello budgets)."""

    def __init__(self, local: LocalSide, remotes: Peers) -> None:
        """``remotes``: the sender's peers, whose ROUTER answers hellos and which welcomes the proved."""
        self.local = local
        self.remotes = remotes
        self._hellos: dict[bytes, Bucket] = {}
        self._fetching: dict[bytes, object] = {}
        self._proving: dict[bytes, Proving] = {}
        """Hellos waiting for their proof echo, by connection."""
        self._probing: dict[bytes, _Sending] = {}
        """Hellos whose metadata a probe child is loading to send the proof nonce, by connection (a
        newer hello on a connection ends the child of the one before). With :attr:`_proving`, at most
        ``Limits.unproved_per_peer`` hellos of a key at once (:meth:`_in_flight`)."""
        self._crashed: dict[bytes, float] = {}
        """Keys whose metadata crashed a probe, until when they are refused."""
        self._unproved: dict[bytes, tuple[int, float]] = {}
        """Keys whose last proof failed: (failures in a row, until when their hellos are refused)."""

    def refuse(self, key: bytes, rank: control.RankInfo, why: str) -> None:
        """Count and log a hello (or a receiver) turned away, with why."""
        self.local.stats["refused_hellos"] += 1
        log.warning("transceiver %s: refused the hello of %r (key %s): %s", self.local.name, rank.name, fingerprint(key), why)

    def on_hello(self, identity: bytes, key: bytes, hello: control.Hello) -> None:
        """A hello on connection ``identity``, authenticated by ``key``: bounded, checked, then its
        metadata read, probed and proved (or the hello refused)."""
        rank, limits = hello.rank, self.local.limits
        bucket = self._hellos.get(key)
        if bucket is None:
            bucket = self._hellos[key] = Bucket(limits.hellos_per_s, limits.hello_burst)
        if not bucket.take():
            return self._busy(identity, key, rank, f"busy: too many hellos of this key (hellos_per_s {limits.hellos_per_s:g}, burst {limits.hello_burst})")
        if rank.num_blocks > limits.max_peer_blocks:
            return self.refuse(key, rank, f"pool of {rank.num_blocks} blocks > max_peer_blocks {limits.max_peer_blocks}")
        if not self.local.plaintext and not agent_carries_key(rank.agent, key):
            # Bound to the key: nobody can name another peer's agent and have us write into its memory.
            return self.refuse(key, rank, f"agent name {rank.agent!r} does not carry its key's fingerprint")
        try:
            segments = block_segments(self.local.layout, rank.layout)
        except ValueError as exc:
            return self.refuse(key, rank, str(exc))
        if rank.metadata:
            self._admit(identity, key, rank, rank.metadata, segments)
        elif not os.environ.get("NIXL_ETCD_ENDPOINTS"):
            self.refuse(key, rank, "no NIXL metadata in the hello and no NIXL_ETCD_ENDPOINTS to read it from")
        elif key in self._fetching:  # (busy: told, with a retry hint, rather than left to its timeout)
            self._busy(identity, key, rank, "busy: a metadata read for this key is already in flight")
        elif len(self._fetching) >= limits.fetches:
            self._busy(identity, key, rank, f"busy: {limits.fetches} metadata reads already in flight")
        else:
            self._start_fetch(identity, key, rank, segments)

    def _start_fetch(self, identity: bytes, key: bytes, rank: control.RankInfo, segments: BlockSegments) -> None:
        """Read the metadata ``rank``'s agent published to etcd on a short-lived thread (one per key).

        NIXL's own fetch watches the key; that watch does not survive an etcd restart and then
        wedges the agent. Reading through the JSON gateway, with a timeout on every call, does not.
        """
        token = object()
        self._fetching[key] = token  # a newer hello of the same key supersedes this read
        deadline = time.monotonic() + self.local.timeout_s
        endpoints = os.environ["NIXL_ETCD_ENDPOINTS"]

        def fetch() -> None:
            blob, error = None, "not published"
            try:
                client: EtcdClient | None = EtcdClient(endpoints, timeout_s=1.0)
            except Exception as exc:  # bad endpoints or etcd settings: refused now, its slot freed
                client, error = None, f"cannot read etcd: {exc}"
            while client is not None and not blob and self._fetching.get(key) is token and time.monotonic() < deadline:
                try:
                    blob = client.get(nixl_metadata_key(rank.agent))
                except RegistryError as exc:
                    error = str(exc)
                if not blob:
                    time.sleep(_REFETCH_S)
            try:
                self.local.loop.submit(lambda: self._on_fetched(identity, key, token, rank, segments, blob, error))
            except RuntimeError:  # closed meanwhile
                pass

        threading.Thread(target=fetch, name=f"kvpolicy-fetch-{fingerprint(key)}", daemon=True).start()

    def _on_fetched(self, identity: bytes, key: bytes, token: object, rank: control.RankInfo, segments: BlockSegments, blob: bytes | None, error: str) -> None:
        if self._fetching.get(key) is not token:
            self.local.stats["superseded_hellos"] += 1
            return
        del self._fetching[key]
        if not blob or len(blob) > control.MAX_METADATA:
            return self.refuse(key, rank, f"its metadata was not found in etcd in time ({error})")
        self._admit(identity, key, rank, blob, segments)

    def _admit(self, identity: bytes, key: bytes, rank: control.RankInfo, blob: bytes, segments: BlockSegments) -> None:
        if agent_of_metadata(blob) != rank.agent:
            return self.refuse(key, rank, "its NIXL metadata names another agent")
        # Nothing a peer sends reaches NIXL's parser (here, in a probe child or in load_agent) unread:
        # the whole blob is read strictly against what this hello announced (:mod:`.metadata`).
        problem = self.local.check_metadata(rank, blob)
        if problem is not None:
            return self.refuse(key, rank, problem)
        banned = self._crashed.get(key, 0.0) - time.monotonic()
        if banned > 0:
            return self.refuse(key, rank, f"its metadata crashed the NIXL parser in a probe; refused for {banned:.0f} s more")
        failures, until = self._unproved.get(key, (0, 0.0))
        if until > time.monotonic():
            # A proof's child connects to the agent a hello's metadata describes, before the proof: a
            # key whose proofs fail waits, so it cannot make this process a deputy against a third party.
            return self.refuse(key, rank, f"its last {failures} proof(s) of memory failed; refused for {until - time.monotonic():.1f} s more")
        in_flight = self._in_flight(key, identity)
        if in_flight >= self.local.limits.unproved_per_peer:
            # Ranks that share a key may connect at once: each waits its turn (a busy answer, no ban),
            # and none ends another's proof. What a key's unproved hellos cost anyone stays bounded.
            return self._busy(identity, key, rank, f"busy: {in_flight} hellos of this key are being proved (unproved_per_peer)")
        earlier = self._probing.pop(identity, None)
        if earlier is not None:  # superseded by this hello: its child ends now (it no longer costs anyone a connection)
            earlier.release()
        if self.local.agent_loaded(blob):
            # Loaded already (only proved peers' metadata is): a receiver back with the same agent,
            # whose worker is bound to it. This side's own agent sends the nonce; no third party.
            return self._admit_loaded(identity, key, rank, blob, segments)
        # Unproved metadata never reaches this side's agent: a short-lived probe child (:mod:`.probe`)
        # loads it (NIXL's parser is not hardened: a hello whose metadata kills the child is refused)
        # and sends the nonce from an agent of its own that carries this side's key; the connection
        # it opens to the agent the metadata describes ends with the child, and the metadata is
        # loaded here only once the receiver echoed the nonce.
        nonce = secrets.token_hex(16)
        self._challenge(identity, nonce)
        token = self._probing[identity] = _Sending(identity, key)

        def sent(verdict: str | None) -> None:
            try:
                self.local.loop.submit(lambda: self._on_sent(identity, key, token, rank, blob, segments, nonce, verdict))
            except RuntimeError:
                pass  # closed meanwhile (closing the probe ends its child)

        # The child's agent carries this side's key (a receiver echoes a nonce only to the sender whose
        # key the claimed agent name carries), under a suffix of its own: never this side's agent.
        agent = f"{self.local.name}-{fingerprint(self.local.identity.public)}-{os.getpid()}-{secrets.token_hex(8)}"
        # (per-key slots: one key's burst cannot crowd out first connects)
        token.release = self.local.probe.prove(blob, sent, agent=agent, message=PROOF_PREFIX + nonce.encode(), linger_s=self._proof_s() + 1.0, owner=key)

    def _challenge(self, identity: bytes, nonce: str) -> None:
        """Tell the hello's connection, before the nonce goes out, which nonce to echo: its digest
        (:class:`.control.Challenge`). A receiver waiting for this welcome may get other nonces under
        agent names that carry this side's key (an insider's hello naming that receiver's agent); it
        echoes only this one, so such a nonce cannot fail its proof."""
        try:
            self.remotes.router.send_multipart([identity, control.encode(control.Challenge(control.nonce_digest(nonce)))], zmq.NOBLOCK)
        except zmq.ZMQError:
            pass  # its queue is full or it is gone: its proof then fails at its deadline, as an unanswered one does

    def _proof_s(self) -> float:
        return min(self.local.timeout_s, PROOF_S)

    def _on_sent(
        self, identity: bytes, key: bytes, token: _Sending, rank: control.RankInfo, blob: bytes, segments: BlockSegments, nonce: str, verdict: str | None
    ) -> None:
        """The probe child sent the nonce to the agent the hello's metadata describes (``verdict``
        None), or could not: the proving starts, or the hello is refused."""
        if self._probing.get(identity) is not token:
            token.release()
            self.local.stats["superseded_hellos"] += 1  # a newer hello on its connection is proved instead
            return
        del self._probing[identity]
        if verdict is not None:
            token.release()
            return self._refuse_verdict(identity, key, rank, verdict)
        stale = self.remotes.forget_stale(identity, key, rank)
        self._start_proving(Proving(identity, key, rank, segments, stale, nonce, blob=blob, release=token.release))
        if token.echo is not None:
            self.on_proof(identity, key, control.Proof(token.echo))

    def _busy(self, identity: bytes, key: bytes, rank: control.RankInfo, why: str) -> None:
        """Refuse a hello that cannot be taken now (``why`` starts with ``busy``: the probe's slots,
        its key's hellos in flight or per second, metadata reads). Not a verdict on the peer: it is
        told, with a retry hint, instead of being left to its connect timeout."""
        refused = control.Refused(why[:500], BUSY_RETRY_MS)
        try:
            self.remotes.router.send_multipart([identity, control.encode(refused)], zmq.NOBLOCK)
        except zmq.ZMQError:
            pass  # its queue is full or it is gone: it times out as before
        self.refuse(key, rank, why)

    def _refuse_verdict(self, identity: bytes, key: bytes, rank: control.RankInfo, verdict: str) -> None:
        """Refuse a hello whose metadata the probe refused, or could not take now (``busy``)."""
        if verdict.startswith("busy"):
            return self._busy(identity, key, rank, f"{verdict} (the sender's metadata probe)")
        if "crashed" in verdict:
            # An honest peer never sends such metadata, and a crash that did not happen in the
            # child may happen here (it depends on memory layout): the key waits before trying again.
            self._crashed[key] = time.monotonic() + CRASH_BAN_S
            self.local.stats["refused_metadata"] += 1
        return self.refuse(key, rank, f"its NIXL metadata failed the probe: {verdict}")

    def _admit_loaded(self, identity: bytes, key: bytes, rank: control.RankInfo, blob: bytes, segments: BlockSegments) -> None:
        """A hello whose exact metadata is loaded here already: this side's agent sends the nonce."""
        stale = self.remotes.forget_stale(identity, key, rank)
        try:
            loaded = self.local.load_agent(blob)
        except Exception as exc:
            return self.refuse(key, rank, f"NIXL rejected its metadata: {exc}")
        if loaded != rank.agent:
            self.local.unload_agent(loaded)
            return self.refuse(key, rank, f"NIXL loaded agent {loaded!r}, not {rank.agent!r}")
        # Prove the memory: the nonce goes as a NIXL notification to the agent this metadata
        # describes, and only that process can echo it (a peer saying hello with another's metadata,
        # renamed as its own agent, never sees it). Welcomed, and written to, only after the echo.
        # 128 bits from the OS's CSPRNG, fresh for this hello and good for one echo: nothing an
        # insider saw of its own proofs helps it guess another's.
        nonce = secrets.token_hex(16)
        self._challenge(identity, nonce)
        try:
            self.local.agent.send_notif(rank.agent, PROOF_PREFIX + nonce.encode())
        except Exception as exc:
            self.local.unload_agent(loaded)
            return self.refuse(key, rank, f"no NIXL notification reaches its agent: {exc}")
        self._start_proving(Proving(identity, key, rank, segments, stale, nonce))

    def _in_flight(self, key: bytes, identity: bytes) -> int:
        """Hellos of ``key`` on other connections than ``identity`` being probed or proved now."""
        return sum(1 for i, s in self._probing.items() if s.key == key and i != identity) + sum(
            1 for i, p in self._proving.items() if p.key == key and i != identity
        )

    def _start_proving(self, proving: Proving) -> None:
        """The nonce is on its way: wait for its echo. A hello again on the same connection before the
        proof of the last one ends that proving as failed."""
        identity = proving.identity
        earlier = self._proving.get(identity)
        if earlier is not None:  # a hello again on the same connection, before the proof of the last one
            self._failed_proof(earlier, "a newer hello on its connection superseded it before its proof of memory came")
        self.local.stats["proofs_asked"] += 1
        proving.timer = self.local.loop.call_at(time.monotonic() + self._proof_s(), lambda: self._proof_expired(proving))
        self._proving[identity] = proving

    def _drop_proving(self, identity: bytes) -> None:
        old = self._proving.pop(identity, None)
        if old is not None:
            old.timer.cancel()
            if old.release is not None:
                old.release()  # (nothing was loaded here)
            else:
                self.local.unload_agent(old.rank.agent)

    def _failed_proof(self, proving: Proving, why: str) -> None:
        """End ``proving`` as failed: its agent unloaded, the key refused for a while (doubling)."""
        if self._proving.get(proving.identity) is proving:
            self._drop_proving(proving.identity)
        self.local.stats["refused_proofs"] += 1
        failures = self._unproved.get(proving.key, (0, 0.0))[0] + 1
        ban = min(self.local.limits.proof_ban_s, 2.0 ** min(failures - 1, 30))
        self._unproved[proving.key] = (failures, time.monotonic() + ban)
        if len(self._unproved) > 4096:  # bounded: the oldest entries go (keys come from the allow-list)
            self._unproved.pop(next(iter(self._unproved)))
        self.refuse(proving.key, proving.rank, f"{why}; its key's hellos are refused for {ban:g} s")

    def _proof_expired(self, proving: Proving) -> None:
        if self._proving.get(proving.identity) is proving:
            self._failed_proof(proving, "it did not echo the nonce sent to the agent of its NIXL metadata in time (is that metadata its own?)")

    def on_proof(self, identity: bytes, key: bytes, proof: control.Proof) -> None:
        """A receiver's echo of its proof nonce: welcomed if it is the nonce sent for its hello."""
        proving = self._proving.get(identity)
        sending = self._probing.get(identity)
        if (proving is None or proving.key != key) and sending is not None and sending.key == key and sending.echo is None:
            sending.echo = proof.nonce  # (it outran the child's report)
        elif proving is None or proving.key != key:
            self.local.drop("unexpected", "a proof from a connection that was not asked for one")
        elif not secrets.compare_digest(proof.nonce, proving.nonce):
            # The first wrong echo ends the proving (a guess gets one try per hello, and hellos are
            # rate-limited per key) and counts against the key.
            self._failed_proof(proving, "it echoed a wrong proof nonce (is the NIXL metadata of its hello its own?)")
        else:
            del self._proving[identity]
            proving.timer.cancel()
            self._unproved.pop(key, None)
            if proving.release is not None:
                # Proved: its probe child is done, and its metadata may now be loaded here.
                proving.release()
                rank = proving.rank
                try:
                    loaded = self.local.load_agent(proving.blob)
                except Exception as exc:
                    return self.refuse(key, rank, f"NIXL rejected its metadata: {exc}")
                if loaded != rank.agent:
                    self.local.unload_agent(loaded)
                    return self.refuse(key, rank, f"NIXL loaded agent {loaded!r}, not {rank.agent!r}")
            self.local.bind_worker(proving.rank.agent)
            self.remotes.welcome(proving)

    def close(self) -> None:
        """End every read, probe and proving in flight (after the loop stopped)."""
        self._fetching.clear()
        for sending in self._probing.values():
            sending.release()
        self._probing.clear()
        for identity in list(self._proving):
            self._drop_proving(identity)
