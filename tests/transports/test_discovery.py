"""The etcd registry: rank records under a namespaced key with a lease, against a real etcd that
serves TLS only, asks for client certificates and has etcd's auth on (as deployed). The attacks on it
are in test_etcd_security.py."""

from __future__ import annotations

import json
import threading
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvpolicy.transports import KVLayout
from kvpolicy.transports import discovery
from kvpolicy.transports.discovery import (
    EtcdClient,
    EtcdRegistry,
    EtcdSecurity,
    InvalidRecord,
    RankRecord,
    RegistryError,
    RegistryUnavailable,
)
from tests.testbed import EtcdServer, free_port

from .conftest import ETCD_WHY, requires_etcd, requires_nixl
from .transfer_worker import WorkerError

KEY = "O=rzdiv-E3qv8KYDT?8?tR:PDof35KVZY(Re.-Ya"  # a CURVE public key (Z85), as zmq.curve_keypair() makes
RECORD = RankRecord("tcp://127.0.0.1:5555", KEY)
PLAIN = EtcdSecurity(insecure_plaintext=True)


@pytest.fixture
def etcd():
    """A fresh TLS-only etcd with auth enabled on 127.0.0.1 (overrides conftest's plain one here)."""
    if ETCD_WHY:
        pytest.skip(ETCD_WHY)
    pytest.importorskip("cryptography", reason="the throwaway CA needs `cryptography` (kvpolicy[transfer])")
    server = EtcdServer("127.0.0.1", secure=True)
    try:
        yield server
    finally:
        server.close()


@pytest.fixture
def plain_etcd():
    """A plain-http etcd on loopback: NIXL's own etcd client speaks neither TLS nor etcd users."""
    if ETCD_WHY:
        pytest.skip(ETCD_WHY)
    server = EtcdServer("127.0.0.1")
    try:
        yield server
    finally:
        server.close()


def wait_until(check, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.05)


@requires_etcd
def test_register_lookup_list_and_close(etcd):
    registry = EtcdRegistry(etcd.endpoint, security=etcd.security, namespace="unit")
    other = EtcdRegistry(etcd.endpoint, security=etcd.security, namespace="other")
    try:
        registration = registry.register("prefill-0", RECORD, ttl_s=5)
        assert registration.key == "/kvpolicy/unit/ranks/prefill-0"
        assert registry.lookup("prefill-0", timeout_s=1.0) == RECORD
        assert registry.lookup("prefill-0", timeout_s=1.0, trusted_keys=[KEY]) == RECORD
        assert registry.lookup_address("prefill-0", timeout_s=1.0) == "tcp://127.0.0.1:5555"
        assert registry.list() == {"prefill-0": RECORD}
        # What is stored is exactly the address and the key, and the beat it promises.
        assert json.loads(etcd.client().get(registration.key)) == {"address": RECORD.address, "public_key": KEY, "ttl_s": 5}
        assert other.list() == {}  # namespaces do not see each other
        # The key carries a lease: revoking it (close) deletes the record at once.
        registration.close()
        assert registry.get("prefill-0") is None
    finally:
        registry.close()
        other.close()


@requires_etcd
def test_lookup_waits_for_a_late_registration(etcd):
    registry = EtcdRegistry(etcd.endpoint, security=etcd.security, namespace="late")
    timer = threading.Timer(0.5, lambda: registry.register("decode-0", RECORD, ttl_s=5))
    timer.start()
    try:
        assert registry.lookup("decode-0", timeout_s=10.0) == RECORD
    finally:
        timer.join(5)
        registry.close()
    with pytest.raises(LookupError, match="no rank 'missing'"):
        registry.lookup("missing", timeout_s=0.3)


@requires_etcd
def test_watch_reports_ranks_appearing_changing_and_going(etcd):
    registry = EtcdRegistry(etcd.endpoint, security=etcd.security, namespace="watched")
    events: list[tuple[dict, set]] = []
    watch = registry.watch(lambda changed, gone: events.append((changed, gone)), poll_s=0.05)
    try:
        registry.register("a", RECORD, ttl_s=5)
        wait_until(lambda: ({"a": RECORD}, set()) in events)
        moved = RankRecord("tcp://127.0.0.1:6666", KEY)
        registry.register("a", moved, ttl_s=5)
        wait_until(lambda: ({"a": moved}, set()) in events)
        registry.unregister("a")
        wait_until(lambda: ({}, {"a"}) in events)
        etcd.stop()
        wait_until(lambda: bool(watch.last_error))
        etcd.start()
        wait_until(lambda: not watch.last_error)
    finally:
        watch.stop()
        registry.close()
    assert not watch._thread.is_alive()


@requires_etcd
def test_a_dead_workers_entry_expires_with_its_lease(etcd):
    registry = EtcdRegistry(etcd.endpoint, security=etcd.security, namespace="dead")
    registration = registry.register("prefill-0", RECORD, ttl_s=2)
    # Die without clean-up: the keep-alive thread stops, nobody revokes the lease.
    registration._stop.set()
    registration._thread.join(5)
    assert registry.get("prefill-0") == RECORD
    wait_until(lambda: registry.get("prefill-0") is None, timeout_s=8.0)


@requires_etcd
def test_keepalive_holds_the_entry_and_rewrites_a_lost_lease(etcd):
    registry = EtcdRegistry(etcd.endpoint, security=etcd.security, namespace="renew")
    try:
        registration = registry.register("prefill-0", RECORD, ttl_s=1)
        time.sleep(2.5)  # longer than the TTL: only renewals keep it
        assert registry.get("prefill-0") == RECORD
        assert registration.renewals >= 2
        # etcd loses the lease (an operator revokes it, or an outage outlives it): written again.
        registry.client.revoke(registration.lease)
        wait_until(lambda: registration.reregistrations >= 1 and registry.get("prefill-0") == RECORD)
    finally:
        registry.close()


@requires_etcd
def test_stopped_etcd_raises_within_the_timeout_and_recovers(etcd):
    registry = EtcdRegistry(etcd.endpoint, security=etcd.security, namespace="outage", timeout_s=0.5)
    try:
        registration = registry.register("prefill-0", RECORD, ttl_s=2)
        etcd.stop()
        started = time.monotonic()
        with pytest.raises(RegistryUnavailable, match="looking up rank 'prefill-0'"):
            registry.lookup("prefill-0", timeout_s=1.0)
        with pytest.raises(RegistryUnavailable):
            registry.list()
        assert time.monotonic() - started < 4.0
        wait_until(lambda: bool(registration.last_error))
        etcd.start()
        wait_until(lambda: registry.get("prefill-0") == RECORD and not registration.last_error)
    finally:
        registry.close()


def test_nothing_listening_is_unavailable_not_a_hang():
    registry = EtcdRegistry(f"http://127.0.0.1:{free_port()}", security=PLAIN, timeout_s=0.5)
    started = time.monotonic()
    with pytest.raises(RegistryUnavailable, match="no etcd endpoint answered"):
        registry.register("prefill-0", RECORD)
    with pytest.raises(RegistryUnavailable):
        registry.lookup("prefill-0", timeout_s=0.5)
    assert time.monotonic() - started < 5.0


@pytest.mark.parametrize("name", ["", "a/b", "../x", "-x", "x" * 200, "sp ace"])
def test_bad_names_are_refused(name):
    registry = EtcdRegistry("http://127.0.0.1:1", security=PLAIN)
    with pytest.raises(ValueError, match="rank name"):
        registry.key(name)


@pytest.mark.parametrize(
    "endpoints", ["", "127.0.0.1:2379", ["ftp://x"], "https://h:2379/v3", "https://u:p@h:2379", "https://h:99999"]
)
def test_bad_endpoints_are_refused(endpoints):
    with pytest.raises(ValueError, match="etcd endpoint|at least one"):
        EtcdClient(endpoints, security=PLAIN)


def test_bad_namespace_and_ttl_are_refused():
    with pytest.raises(ValueError, match="namespace"):
        EtcdRegistry("http://127.0.0.1:1", security=PLAIN, namespace="a/b")
    registry = EtcdRegistry("http://127.0.0.1:1", security=PLAIN)
    for ttl in (0, -1, 1.5, True, 10_000):
        with pytest.raises(ValueError, match="ttl_s"):
            registry.register("x", RECORD, ttl_s=ttl)


@requires_etcd
def test_foreign_entries_are_skipped_not_trusted(etcd):
    registry = EtcdRegistry(etcd.endpoint, security=etcd.security, namespace="foreign")
    registry.client.put(registry.key("garbage"), b"\xff not json")
    registry.client.put(registry.key("array"), json.dumps([1, 2]).encode())
    registry.client.put(registry.key("no-address"), json.dumps({"address": "tcp://10.0.0.1:5555; rm -rf"}).encode())
    registry.client.put(registry.key("bad-key"), json.dumps({"address": "tcp://h:1", "public_key": "short"}).encode())
    registry.register("good", RECORD, ttl_s=5)
    try:
        assert registry.list() == {"good": RECORD}
        with pytest.raises(RegistryError, match="not JSON"):
            registry.get("garbage")
        with pytest.raises(RegistryError, match="not a map"):
            registry.lookup("array", timeout_s=0.5)
        with pytest.raises(RegistryError, match="'no-address'.*must be tcp://host:port"):
            registry.lookup_address("no-address", timeout_s=0.5)
        with pytest.raises(RegistryError, match="'bad-key'.*Z85"):
            registry.get("bad-key")
    finally:
        registry.close()


@requires_nixl
@requires_etcd
def test_nixl_metadata_through_etcd_on_loopback(plain_etcd, workers):
    """Both ranks publish their NIXL agent metadata to etcd; the hello carries only the agent name,
    and the decode side finds the prefill side by name in the registry. NIXL's etcd client has no
    TLS and no users, so this mode needs a plain etcd on loopback (and the explicit flag)."""
    etcd = plain_etcd
    layout = KVLayout(num_layers=2, kv_heads=2, tokens_per_block=8, head_dim=32)
    env = {"NIXL_ETCD_ENDPOINTS": etcd.endpoint, **etcd.client_env()}
    config = dict(layout=layout.to_wire(), metadata="etcd", env=env)
    prefill = workers("prefill", seed=1, **config)
    decode = workers("decode", seed=2, **config)
    prefill.call("register", etcd.endpoint, "loop", 5, prefill.key_name)  # a sender's rank name is its key's name
    assert decode.call("connect_by_name", etcd.endpoint, "loop", prefill.key_name) == prefill.key_name
    prefill.call("send", "r", [1, 2, 3])
    decode.call("receive", "r", [4, 5, 6])
    assert decode.call("wait", "r")["state"] == "completed"
    assert decode.call("digests", [4, 5, 6]) == prefill.call("digests", [1, 2, 3])
    # NIXL's own entries live beside ours in the same etcd.
    keys = etcd.client().get_prefix("/")
    # Address and CURVE public key (proved in the handshake), and the beat it promises; nothing else.
    assert json.loads(keys[f"/kvpolicy/loop/ranks/{prefill.key_name}"]).keys() == {"address", "public_key", "ttl_s"}
    assert any(not k.startswith("/kvpolicy/") for k in keys), sorted(keys)


def test_etcd_metadata_needs_the_endpoints(monkeypatch):
    from .conftest import NIXL_OK

    if not NIXL_OK:
        pytest.skip("NIXL cannot load here")
    from kvpolicy.transports import BlockPool, NixlTransceiver

    monkeypatch.delenv("NIXL_ETCD_ENDPOINTS", raising=False)
    pool = BlockPool(KVLayout(num_layers=1, kv_heads=1, tokens_per_block=4, head_dim=8), 2, huge_pages=False)
    with pytest.raises(ValueError, match="NIXL_ETCD_ENDPOINTS"):
        NixlTransceiver(pool, metadata="etcd")
    with pytest.raises(ValueError, match="metadata must be"):
        NixlTransceiver(pool, metadata="zookeeper")


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=50),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.sampled_from(["address", "public_key", "ttl_s", "x"]), inner, max_size=3),
    max_leaves=10,
)


@settings(max_examples=300, deadline=None)
@given(
    st.one_of(
        st.binary(max_size=300),
        json_values.map(lambda v: json.dumps(v).encode()),
        st.fixed_dictionaries(
            {"address": st.builds("tcp://{}:{}".format, st.sampled_from(["h", "10.0.0.1", "[::1]"]), st.integers(0, 70000))},
            optional={"public_key": st.sampled_from([KEY, "", KEY[:-1]]), "ttl_s": json_values, "agent": json_values},
        ).map(lambda v: json.dumps(v).encode()),
    )
)
def test_any_stored_bytes_parse_to_a_record_or_a_registry_error(value):
    """Whatever someone wrote under our prefix, reading it gives a valid record or a RegistryError
    naming the rank, never another exception."""
    try:
        record = RankRecord.parse("r", value)
    except RegistryError as exc:
        assert "rank 'r'" in str(exc)
    else:
        assert RankRecord.parse("r", record.to_json()) == record
        assert json.loads(record.to_json()).keys() <= {"address", "public_key"}


# -- the key a record names is the key connect() uses (issue 26, item 1) ----------------------------


def keyed(endpoint: str, key: str) -> str:
    """``endpoint`` carrying ``key`` (Z85) as a transceiver's ``address`` does: tcp://HEX@host:port."""
    pytest.importorskip("zmq")
    from kvpolicy.transports.addresses import address_with_key

    return address_with_key(endpoint, key.encode())


def other_key() -> str:
    import zmq

    return zmq.curve_keypair()[0].decode()


def test_a_record_must_name_the_key_its_address_carries():
    address = keyed("tcp://10.0.0.1:5555", KEY)
    filled = RankRecord(address)  # no public_key: taken from the address
    assert filled.public_key == KEY and filled.address_key == KEY
    assert filled == RankRecord(address, KEY)
    assert RankRecord.parse("r", filled.to_json()) == filled
    assert json.loads(filled.to_json()) == {"address": address, "public_key": KEY}
    assert RankRecord("tcp://10.0.0.1:5555", KEY).address_key is None  # no key in the address: nothing to compare
    rogue = keyed("tcp://10.0.0.1:6666", other_key())
    with pytest.raises(discovery.KeyMismatch, match="address carries public key [0-9a-f]{16} but public_key names"):
        RankRecord(rogue, KEY)
    with pytest.raises(ValueError, match="connect\\(\\) would use the address's key"):
        RankRecord.from_mapping({"address": rogue, "public_key": KEY, "agent": "x"})
    with pytest.raises(InvalidRecord, match="record of rank 'prefill-0': rank address carries") as refused:
        RankRecord.parse("prefill-0", json.dumps({"address": rogue, "public_key": KEY}).encode())
    assert refused.value.reason == "key-mismatch"
    # A key part that is not a key is refused here, not later at connect().
    with pytest.raises(ValueError, match="public key in hex"):
        RankRecord("tcp://zz@10.0.0.1:5555", KEY)
    with pytest.raises(ValueError, match="32 bytes"):
        RankRecord("tcp://abcd@10.0.0.1:5555")
    with pytest.raises(ValueError, match="public key in hex"):  # the last '@' splits, as connect() splits
        RankRecord(rogue.replace("@", "@x@"), KEY)


def test_the_address_key_is_read_as_connect_reads_it_with_or_without_pyzmq(monkeypatch):
    """address_key() is addresses.split_address (what connect() uses); without pyzmq, its own Z85
    encoder gives the same text as pyzmq's."""
    import os

    from zmq.utils import z85

    from kvpolicy.transports import addresses
    from kvpolicy.transports.addresses import split_address

    samples = [keyed("tcp://10.0.0.1:5555", other_key()) for _ in range(20)]
    samples += [s.replace("tcp://", "tcp://").upper().replace("TCP://", "tcp://") for s in samples[:5]]  # upper-case hex
    samples += ["tcp://10.0.0.1:5555", "tcp://[::1]:5555"]
    expected = [None if split_address(a)[1] is None else split_address(a)[1].decode() for a in samples]
    assert [discovery.address_key(a) for a in samples] == expected

    def no_zmq():
        raise ModuleNotFoundError("No module named 'zmq'")

    monkeypatch.setattr(addresses, "_z85", no_zmq)
    assert [discovery.address_key(a) for a in samples] == expected
    for _ in range(50):
        raw = os.urandom(32)
        assert addresses.z85_encode(raw) == z85.encode(raw)
    with pytest.raises(ValueError, match="public key in hex"):
        discovery.address_key("tcp://zz@h:1")
    with pytest.raises(ValueError, match="32 bytes"):
        discovery.address_key("tcp://abcd@h:1")


_HEX_KEYS = st.binary(min_size=32, max_size=32)


@settings(max_examples=200, deadline=None)
@given(_HEX_KEYS, st.sampled_from(["same", "other", "none"]))
def test_a_parsed_record_never_names_two_keys(raw, public):
    """Whatever pair of keys a writer puts in a record, a parsed record's public_key is the key its
    address carries (the one connect() uses), or parsing refuses it."""
    pytest.importorskip("zmq")
    from zmq.utils import z85

    carried = z85.encode(raw).decode()
    fields = {"address": f"tcp://{raw.hex()}@10.0.0.1:5555"}
    if public != "none":
        fields["public_key"] = carried if public == "same" else KEY
    try:
        record = RankRecord.parse("r", json.dumps(fields).encode())
    except InvalidRecord as exc:
        assert exc.reason == "key-mismatch" and public == "other" and carried != KEY
    else:
        assert record.public_key == record.address_key == carried


# -- garbled records stall only their own name (issue 26, item 3) -----------------------------------

GARBLED = {
    "bad-json": (b'{"address": "tcp://h:1", ', "not-json", "is not JSON"),
    "bad-types": (json.dumps({"address": 5555, "public_key": ["x"]}).encode(), "invalid", "must be tcp://host:port"),
    "bad-key-type": (json.dumps({"address": "tcp://h:1", "public_key": 7}).encode(), "invalid", "Z85"),
    "a-list": (json.dumps(["tcp://h:1", KEY]).encode(), "not-a-map", "is a list, not a map"),
    "huge": (json.dumps({"address": "tcp://h:1", "pad": "x" * (1 << 20)}).encode(), "too-large", "over the 4096 limit"),
    "deep": (b"[" * 2000 + b"]" * 2000, "not-json", "is not JSON"),  # RecursionError in json, not ValueError
}


@requires_etcd
def test_a_garbled_record_stalls_only_the_lookup_of_its_own_name(etcd, caplog):
    registry = EtcdRegistry(etcd.endpoint, security=etcd.security, namespace="garbled")
    writer = etcd.client()
    for name, (value, _, _) in GARBLED.items():
        writer.put(registry.key(name), value)
    writer.put(registry.prefix + "not/a/rank", RECORD.to_json())  # a key no rank name makes
    registry.register("good", RECORD, ttl_s=5)
    try:
        caplog.set_level("WARNING", logger="kvpolicy.transports")
        for name, (_, reason, problem) in GARBLED.items():
            started = time.monotonic()
            with pytest.raises(InvalidRecord, match=f"no usable record of rank '{name}' within 0.6s; .*{problem}") as err:
                registry.lookup(name, timeout_s=0.6)
            assert time.monotonic() - started >= 0.45, "the lookup kept waiting for a valid record"
            assert err.value.reason == reason
            assert registry.skipped[reason] >= 2  # every poll skipped it ...
            warnings = [r for r in caplog.records if f"'{name}'" in r.getMessage()]
            assert len(warnings) == 1, warnings  # ... and the log says so once
        # The other names are untouched: lookups return at once, list() skips and reports the bad ones.
        started = time.monotonic()
        assert registry.lookup("good", timeout_s=1.0, trusted_keys=[KEY]) == RECORD
        assert time.monotonic() - started < 0.5
        assert registry.list() == {"good": RECORD}
        assert set(registry.last_skipped) == {*GARBLED, "not/a/rank"}
        assert "over the 4096 limit" in registry.last_skipped["huge"]
        assert "names no rank" in registry.last_skipped["not/a/rank"]
        logged = len(caplog.records)
        registry.list()
        assert len(caplog.records) == logged  # the same problems are not logged again on every poll
        # A lookup that meets garbage keeps waiting, and returns the record once it is valid again.
        timer = threading.Timer(0.5, lambda: writer.put(registry.key("bad-json"), RECORD.to_json()))
        timer.start()
        assert registry.lookup("bad-json", timeout_s=10.0) == RECORD
        timer.join(5)
        assert "bad-json" in registry.list()
        assert "bad-json" not in registry.last_skipped
    finally:
        registry.close()


@requires_etcd
def test_values_too_large_for_one_answer_hide_no_other_rank(etcd):
    """Records near etcd's request limit (1.5 MiB) make one range of the whole prefix larger than the
    client reads (4 MiB): list() then reads key by key; lookups and watches of others go on."""
    registry = EtcdRegistry(etcd.endpoint, security=etcd.security, namespace="stuffed")
    writer = etcd.client(timeout_s=10.0)
    registry.register("good", RECORD, ttl_s=5)
    events: list[dict] = []
    watch = registry.watch(lambda changed, gone: events.append(changed), poll_s=0.1)
    try:
        wait_until(lambda: {"good": RECORD} in events)
        for i in range(3):
            writer.put(registry.key(f"stuffing-{i}"), b"x" * (1400 << 10))
        with pytest.raises(RegistryError, match="no JSON map"):
            writer.get_prefix(registry.prefix)  # what list() used to raise for everyone
        assert registry.list() == {"good": RECORD}
        assert {n: "1433600 bytes" in why for n, why in registry.last_skipped.items()} == {f"stuffing-{i}": True for i in range(3)}
        assert registry.lookup("good", timeout_s=1.0, trusted_keys=[KEY]) == RECORD
        moved = RankRecord("tcp://127.0.0.1:7777", KEY)
        registry.register("good", moved, ttl_s=5)
        wait_until(lambda: {"good": moved} in events)
        assert watch.last_error == ""
    finally:
        watch.stop()
        registry.close()


@requires_etcd
@requires_nixl
def test_a_record_under_another_senders_name_is_never_followed(etcd, workers):
    """Issue 41, as an insider did it: the holder of another allowed sender's key (and of the prefill
    etcd user) writes a well-formed record for the honest prefill's name carrying its *own* key and
    address. A decoder that looks the name up bound to its allow-list skips it (``name-key-mismatch``)
    in both forms (with the sender keys as trusted_keys, and without), never connects to the rogue,
    and is served by the honest prefill once its record is back; a connect to the rogue's address
    under the honest name is refused before any request."""
    layout = KVLayout(num_layers=2, kv_heads=2, tokens_per_block=8, head_dim=32)
    config = dict(layout=layout.to_wire(), env=etcd.client_env())
    honest = workers("prefill", seed=1, **config)
    rogue = workers("prefill", seed=9, **config)  # another sender this decoder allows: a compromised peer
    decode = workers("decode", seed=2, **config)
    namespace, name = "hijack", honest.key_name
    rogue.call("register", etcd.endpoint, namespace, 30, name)  # its own key and address, under prefill-0's name
    for trusted in (None, [honest.call("public_key"), rogue.call("public_key")]):
        answer = decode.call("lookup_bound", etcd.endpoint, namespace, name, 0.5, trusted_keys=trusted)
        assert answer.startswith("InvalidRecord") and f"the allow-list's {name}.key is" in answer, answer
    with pytest.raises(WorkerError, match="name-key-mismatch|allow-list"):
        decode.call("connect_by_name", etcd.endpoint, namespace, name, timeout_s=1.0)
    with pytest.raises(WorkerError, match=f"holds the key named {rogue.key_name!r}, not {name!r}"):
        decode.call("connect", rogue.address, name=name)  # the address alone, under the honest name
    assert decode.call("peers") == []  # it never reached the rogue
    # The honest owner takes its name back (the rogue's registration goes on fighting for it).
    honest.call("register", etcd.endpoint, namespace, 30, name)
    assert decode.call("connect_by_name", etcd.endpoint, namespace, name, timeout_s=20.0) == name
    honest.call("send", "r", [1, 2, 3], to=decode.key_name)
    decode.call("receive", "r", [4, 5, 6], peers=[name])
    assert decode.call("wait", "r")["state"] == "completed"
    assert decode.call("digests", [4, 5, 6]) == honest.call("digests", [1, 2, 3])
    assert decode.call("peers") == [name]


# -- the beat a record promises (issue 38, item 8) ----------------------------------------------------

HOSTILE_TTLS = [0, -1, 3601, 10**9, "5", 5.5, 5.0, True, False, None, [5], {"s": 5}]


@pytest.mark.parametrize("ttl", HOSTILE_TTLS, ids=repr)
def test_a_stored_ttl_must_be_an_int_from_1_to_3600(ttl):
    """ttl_s is the promise readers judge staleness by: anything but an int 1..3600 makes the record invalid."""
    value = json.dumps({"address": RECORD.address, "public_key": KEY, "ttl_s": ttl}).encode()
    with pytest.raises(InvalidRecord, match=r"record of rank 'r': ttl_s .* must be an int between 1 and 3600, not ") as refused:
        RankRecord.parse("r", value)
    assert refused.value.reason == "invalid"
    for good in (1, 10, 3600):
        assert RankRecord.parse("r", json.dumps({"address": RECORD.address, "public_key": KEY, "ttl_s": good}).encode()) == RECORD


@requires_etcd
def test_a_hostile_ttl_is_refused_by_lookup_and_list(etcd):
    registry = EtcdRegistry(etcd.endpoint, security=etcd.security, namespace="ttl")
    writer = etcd.client()
    names = {f"t{i}": ttl for i, ttl in enumerate([0, -1, 10**9, "5", 5.5, True])}
    for name, ttl in names.items():
        writer.put(registry.key(name), json.dumps({"address": RECORD.address, "public_key": KEY, "ttl_s": ttl}).encode())
    with registry:
        registry.register("good", RECORD, ttl_s=5)
        assert registry.list() == {"good": RECORD}
        assert set(registry.last_skipped) == set(names)
        assert all("ttl_s" in why and "must be an int between 1 and 3600" in why for why in registry.last_skipped.values())
        for name in ("t0", "t3"):
            with pytest.raises(InvalidRecord, match=f"no usable record of rank '{name}' .* ttl_s") as refused:
                registry.lookup(name, timeout_s=0.3)
            assert refused.value.reason == "invalid"


@requires_etcd
def test_only_a_record_that_promises_a_ttl_is_judged_stale(etcd):
    """Records written by hand (no lease, nobody rewrites them): one that promises ttl_s=1 goes stale
    once this reader has seen it unchanged for a second; one without ttl_s (an older sender's) never
    does; the first sight of a stale one is not known stale. A rewrite makes it fresh again."""
    registry = EtcdRegistry(etcd.endpoint, security=etcd.security, namespace="promise")
    writer = etcd.client()
    promised = json.dumps({"address": RECORD.address, "public_key": KEY, "ttl_s": 1}).encode()
    writer.put(registry.key("promised"), promised)
    writer.put(registry.key("older"), RECORD.to_json())
    assert registry.list() == {"promised": RECORD, "older": RECORD}  # first sight
    wait_until(lambda: "promised" not in registry.list())
    assert registry.skipped["stale"] >= 1 and "past the ttl_s of 1" in registry.last_skipped["promised"]
    assert registry.lookup("older", timeout_s=0.5) == RECORD
    with pytest.raises(InvalidRecord) as stale:
        registry.lookup("promised", timeout_s=0.3)
    assert stale.value.reason == "stale"
    assert EtcdRegistry(etcd.endpoint, security=etcd.security, namespace="promise").lookup("promised", timeout_s=0.3) == RECORD
    timer = threading.Timer(0.3, lambda: writer.put(registry.key("promised"), promised))  # the same bytes: a beat
    timer.start()
    assert registry.lookup("promised", timeout_s=10.0) == RECORD
    timer.join(5)
    assert registry.list() == {"promised": RECORD, "older": RECORD}
    writer.delete(registry.key("promised"))
    assert registry.list() == {"older": RECORD}


@requires_etcd
def test_each_keep_alive_round_is_a_write_checked_by_its_revision(etcd):
    """The heartbeat: every round gives the record a new mod_revision (the keep-alive's own write, on
    its lease, counted as a renewal), and a record someone else changed is still restored, once."""
    registry = EtcdRegistry(etcd.endpoint, security=etcd.security, namespace="beat")
    with registry:
        registration = registry.register("prefill-0", RECORD, ttl_s=1)
        reader = etcd.client()
        first = int(reader.get_entry(registration.key)["mod_revision"])
        assert first == registration.mod_revision
        wait_until(lambda: registration.renewals >= 2)
        entry = reader.get_entry(registration.key)
        assert int(entry["mod_revision"]) > first and int(entry["lease"]) == registration.lease
        assert registration.restorations == 0
        # The client call alone: a beat when unchanged, a restoration (with what was found) when not.
        key, value = "/kvpolicy/beat/other", b"v"
        revision = reader.put(key, value)
        beat, found, changed = reader.rewrite_unless_changed(key, value, mod_revision=revision)
        assert beat > revision and found is None and not changed
        reader.put(key, b"rogue")
        restored, found, changed = reader.rewrite_unless_changed(key, value, mod_revision=beat)
        assert changed and found is not None and found["value"] == "cm9ndWU=" and reader.get(key) == value
        assert int(reader.get_entry(key)["mod_revision"]) == restored
        reader.delete(key)
        _, found, changed = reader.rewrite_unless_changed(key, value, mod_revision=restored)
        assert changed and found is None and reader.get(key) == value
        assert reader.restore_if_changed(key, value, mod_revision=int(reader.get_entry(key)["mod_revision"])) is None


@requires_etcd
def test_an_etcd_outage_longer_than_the_ttl_makes_no_rank_look_dead(etcd):
    """While etcd is down no sender can beat, so the time a reader could not look is not held against
    them: after a restart the watch does not report a live rank gone while it waits for its next beat."""
    registry = EtcdRegistry(etcd.endpoint, security=etcd.security, namespace="outage-beat", timeout_s=0.5)
    events: list[tuple[dict, set]] = []
    watch = registry.watch(lambda changed, gone: events.append((changed, gone)), poll_s=0.05)
    try:
        registration = registry.register("prefill-0", RECORD, ttl_s=1)
        wait_until(lambda: ({"prefill-0": RECORD}, set()) in events)
        etcd.stop()
        stopped = time.monotonic()
        wait_until(lambda: bool(watch.last_error) and time.monotonic() > stopped + 2.0)  # twice the TTL
        with registration._lock:  # the sender's next beat waits until the watch has looked a while
            etcd.start()
            wait_until(lambda: not watch.last_error)
            recovered = time.monotonic()
            wait_until(lambda: time.monotonic() > recovered + 0.5)  # ten polls
        renewals = registration.renewals
        wait_until(lambda: registration.renewals > renewals + 1)
        assert not any(gone for _, gone in events), events
        assert registry.lookup("prefill-0", timeout_s=1.0) == RECORD
    finally:
        watch.stop()
        registry.close()
