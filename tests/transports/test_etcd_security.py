"""Attacks on the registry (issue 11, items 4 and 5; issue 26, items 1 and 2; issue 38, item 8), each
against a real etcd serving TLS only, with client certificates required and etcd's auth on: strangers,
a wrong role, a wrong CA, an expired token, a hijacked rank record, a record whose address carries
another key than the one it names, a dead sender's lease kept alive by a reader, and what each side's
role (prefill, decode, one sender) may still do."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import ssl
import subprocess
import sys
import threading
import time

import pytest

from kvpolicy.transports.discovery import (
    EtcdClient,
    EtcdRegistry,
    EtcdSecurity,
    InvalidRecord,
    RankRecord,
    RegistryDenied,
    RegistryError,
    nixl_metadata_key,
)
from tests.testbed import EtcdServer, make_pki

from .conftest import ETCD_WHY

GENUINE_KEY = "O=rzdiv-E3qv8KYDT?8?tR:PDof35KVZY(Re.-Ya"
ROGUE_KEY = "JW.#B@/ypIuR^FWkUUkw?XC>IQfj%.o1eZAOcEi."
GENUINE = RankRecord("tcp://127.0.0.1:5555", GENUINE_KEY)
ROGUE = RankRecord("tcp://127.0.0.1:6666", ROGUE_KEY)


def start_server(**options) -> EtcdServer:
    if ETCD_WHY:
        pytest.skip(ETCD_WHY)
    pytest.importorskip("cryptography", reason="the throwaway CA needs `cryptography` (kvpolicy[transfer])")
    return EtcdServer("127.0.0.1", secure=True, **options)


@pytest.fixture(scope="module")
def etcd():
    """One secure etcd for the module: these tests only add users and keys of their own."""
    server = start_server()
    try:
        yield server
    finally:
        server.close()


def wait_until(check, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.05)


def tls_only(server: EtcdServer) -> EtcdSecurity:
    """The right CA and a valid client certificate, but no etcd user."""
    pki = server.pki
    return EtcdSecurity(pki.ca_file, pki.client_cert, pki.client_key)


# -- strangers ------------------------------------------------------------------------------------


def test_a_client_without_a_certificate_is_refused_at_tls(etcd):
    stranger = EtcdClient(etcd.endpoint, security=EtcdSecurity(ca_file=etcd.pki.ca_file), timeout_s=2.0)
    with pytest.raises(RegistryDenied, match="TLS refused"):
        stranger.get("/kvpolicy/any/ranks/x")


def test_a_stranger_with_a_certificate_but_no_user_reads_and_writes_nothing(etcd):
    registry = EtcdRegistry(etcd.endpoint, security=etcd.security, namespace="stranger")
    with registry:
        registry.register("prefill-0", GENUINE, ttl_s=5)
        key = registry.key("prefill-0")
        stranger = EtcdClient(etcd.endpoint, security=tls_only(etcd))
        for attempt in (
            lambda: stranger.get(key),
            lambda: stranger.get_prefix("/"),
            lambda: stranger.put(key, ROGUE.to_json()),
            lambda: stranger.delete(key),
        ):
            with pytest.raises(RegistryDenied, match="permission denied"):
                attempt()
        assert registry.get("prefill-0") == GENUINE


def test_a_wrong_password_gets_no_token(etcd):
    wrong = EtcdSecurity(**_tls(etcd), user=etcd.security.user, password="not-the-password")
    with pytest.raises(RegistryDenied, match="authentication failed"):
        EtcdClient(etcd.endpoint, security=wrong).get("/kvpolicy/x")


def test_a_read_only_role_cannot_write_and_another_prefix_cannot_read(etcd):
    writer = EtcdRegistry(etcd.endpoint, security=etcd.security, namespace="roles")
    reader_security = etcd.add_user("observer", "observer-pw", "/kvpolicy/roles/", "READ")
    other_security = etcd.add_user("other-team", "other-pw", "/kvpolicy/other-team/")
    with writer:
        writer.register("prefill-0", GENUINE, ttl_s=5)
        reader = EtcdRegistry(etcd.endpoint, security=reader_security, namespace="roles")
        assert reader.lookup("prefill-0", timeout_s=1.0) == GENUINE  # reading is what the role allows
        with pytest.raises(RegistryDenied, match="permission denied"):
            reader.client.put(reader.key("prefill-0"), ROGUE.to_json())
        with pytest.raises(RegistryDenied, match="permission denied"):
            reader.register("prefill-1", ROGUE, ttl_s=5)
        other = EtcdRegistry(etcd.endpoint, security=other_security, namespace="roles")
        with pytest.raises(RegistryDenied, match="permission denied"):
            other.get("prefill-0")
        with pytest.raises(RegistryDenied, match="permission denied"):
            other.client.put(other.key("prefill-0"), ROGUE.to_json())
        assert writer.get("prefill-0") == GENUINE


def test_a_server_certificate_from_another_ca_is_refused(etcd, tmp_path):
    foreign = make_pki(str(tmp_path / "foreign"), ["127.0.0.1"])
    # Trusting another CA, with that CA's client certificate: our client refuses etcd's certificate.
    wrong_ca = EtcdSecurity(foreign.ca_file, foreign.client_cert, foreign.client_key, user="kvpolicy", password="x")
    with pytest.raises(RegistryDenied, match="does not verify against .*ca.pem"):
        EtcdClient(etcd.endpoint, security=wrong_ca).get("/kvpolicy/x")
    # Trusting etcd's CA but presenting a certificate of another CA: etcd refuses us.
    wrong_cert = EtcdSecurity(etcd.pki.ca_file, foreign.client_cert, foreign.client_key)
    with pytest.raises(RegistryDenied, match="TLS refused"):
        EtcdClient(etcd.endpoint, security=wrong_cert).get("/kvpolicy/x")


def test_a_server_certificate_common_name_must_not_be_a_user(tmp_path):
    """etcd 3.4's gateway calls etcd with the server certificate, so a call without a token runs as
    the user named like that certificate's common name: the README tells operators never to create
    one. This shows why (and that the test bed's name is no user)."""
    with start_server() as server:
        anonymous = EtcdClient(server.endpoint, security=tls_only(server))
        with pytest.raises(RegistryDenied):
            anonymous.get("/kvpolicy/x")
        server.add_user("kvpolicy-etcd-server", "pw", "/kvpolicy/")
        assert anonymous.get("/kvpolicy/x") is None  # answered: the call now runs as that user


def _tls(server: EtcdServer) -> dict[str, str]:
    pki = server.pki
    return {"ca_file": pki.ca_file, "cert_file": pki.client_cert, "key_file": pki.client_key}


# -- the client's own rules -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("endpoint", "security", "message"),
    [
        ("http://127.0.0.1:2379", EtcdSecurity(), "plain http"),
        ("http://10.0.0.5:2379", EtcdSecurity(insecure_plaintext=True), "loopback only"),
        ("http://127.0.0.1:2379", EtcdSecurity(user="u", password="p", insecure_plaintext=True), "credentials over plain http"),
    ],
)
def test_plain_http_only_to_loopback_never_with_credentials(endpoint, security, message):
    with pytest.raises(ValueError, match=message):
        EtcdClient(endpoint, security=security)


def test_security_settings_are_checked_together(tmp_path):
    with pytest.raises(ValueError, match="cert_file and key_file"):
        EtcdSecurity(cert_file=__file__)
    with pytest.raises(ValueError, match="user and password"):
        EtcdSecurity(user="u")
    with pytest.raises(ValueError, match="ca_file .* is not a readable file"):
        EtcdSecurity(ca_file=str(tmp_path / "missing.pem"))
    assert "secret" not in repr(EtcdSecurity(user="u", password="secret"))
    not_pem = tmp_path / "not.pem"
    not_pem.write_text("not a certificate")
    with pytest.raises(ValueError, match="cannot load .* as PEM"):
        EtcdClient("https://127.0.0.1:2379", security=EtcdSecurity(ca_file=str(not_pem)))


def test_security_from_the_environment_reads_the_password_from_a_file(etcd):
    env = etcd.client_env()
    assert etcd.security.password not in env.values()  # a child's environment names a file, not the password
    security = EtcdSecurity.from_env(env)
    assert security == etcd.security
    assert oct(os.stat(env["KVPOLICY_ETCD_PASSWORD_FILE"]).st_mode & 0o777) == "0o600"
    with pytest.raises(ValueError, match="KVPOLICY_ETCD_PASSWORD_FILE"):
        EtcdSecurity.from_env({"KVPOLICY_ETCD_PASSWORD_FILE": "/nonexistent/pw", "KVPOLICY_ETCD_USER": "u"})


def test_the_tls_context_verifies_the_host_and_asks_tls_1_2(etcd):
    context = etcd.security.tls_context()
    assert context.verify_mode == ssl.CERT_REQUIRED and context.check_hostname
    assert context.minimum_version >= ssl.TLSVersion.TLSv1_2


# -- tokens ---------------------------------------------------------------------------------------


def test_an_expired_token_is_renewed():
    with start_server(token_ttl_s=1) as server:
        client = server.client()
        client.put("/kvpolicy/t/a", b"1")
        assert client.authentications == 1
        time.sleep(2.5)  # the token outlives --auth-token-ttl unused
        assert client.get("/kvpolicy/t/a") == b"1"
        assert client.authentications == 2


def test_a_token_from_before_a_restart_is_renewed(etcd):
    client = etcd.client()
    client.put("/kvpolicy/restart/a", b"1")
    before = client.authentications
    etcd.stop()
    etcd.start()  # simple tokens live in the server's memory only
    assert client.get("/kvpolicy/restart/a") == b"1"
    assert client.authentications == before + 1


# -- hijacking a rank record ----------------------------------------------------------------------


def test_a_hijacked_record_is_detected_and_restored_by_the_keep_alive(etcd):
    registry = EtcdRegistry(etcd.endpoint, security=etcd.security, namespace="hijack")
    # The attacker holds write access to the prefix (a compromised rank, or a second process).
    attacker = etcd.client()
    with registry:
        registration = registry.register("prefill-0", GENUINE, ttl_s=1)
        key = registration.key
        attacker.put(key, ROGUE.to_json())
        wait_until(lambda: registration.restorations >= 1)
        assert "tcp://127.0.0.1:6666" in registration.last_foreign
        assert registry.get("prefill-0") == GENUINE
        # Deleting it is noticed too.
        attacker.delete(key)
        wait_until(lambda: registration.restorations >= 2 and registry.get("prefill-0") == GENUINE)
        assert registration.last_foreign == "deleted"
        # Rewriting the same bytes without the lease (so the record would outlive its owner) as well.
        attacker.put(key, GENUINE.to_json())
        wait_until(lambda: registration.restorations >= 3)
        entry = attacker.get_entry(key)
        assert int(entry["lease"]) == registration.lease
        renewals = registration.renewals
        wait_until(lambda: registration.renewals > renewals)  # and left alone once restored
        assert registration.restorations == 3


def test_a_reader_with_trusted_keys_never_uses_a_forged_record(etcd):
    registry = EtcdRegistry(etcd.endpoint, security=etcd.security, namespace="forged")
    attacker = etcd.client()
    with registry:
        key = registry.key("prefill-0")
        attacker.put(key, ROGUE.to_json())  # no genuine owner: the forgery stays
        with pytest.raises(RegistryError, match="not among the 1 trusted sender keys"):
            registry.lookup("prefill-0", timeout_s=0.5, trusted_keys=[GENUINE_KEY])
        attacker.put(key, json.dumps({"address": "tcp://127.0.0.1:6666"}).encode())  # no key at all
        with pytest.raises(RegistryError, match=r"\(none\), which is not among"):
            registry.lookup("prefill-0", timeout_s=0.5, trusted_keys=[GENUINE_KEY])
        # With a genuine owner, a reader that meets the forgery waits for the restored record.
        registration = registry.register("prefill-0", GENUINE, ttl_s=1)
        attacker.put(key, ROGUE.to_json())
        assert registry.get("prefill-0") == ROGUE
        assert registry.lookup("prefill-0", timeout_s=10.0, trusted_keys=[GENUINE_KEY]) == GENUINE
        assert registration.restorations >= 1


def test_only_the_address_and_key_are_published(etcd):
    """A transceiver's whole rank info goes in; only what a decoder needs before it connects comes out."""
    info = {
        "address": "tcp://127.0.0.1:5555",
        "public_key": GENUINE_KEY,
        "agent": "prefill-1",
        "layout": {"num_layers": 2},
        "num_blocks": 64,
        "pool_address": 140_000_000,
        "metadata": "inline",
    }
    with EtcdRegistry(etcd.endpoint, security=etcd.security, namespace="minimal") as registry:
        registration = registry.register("prefill-0", info, ttl_s=5)
        stored = json.loads(etcd.client().get(registration.key))
        assert stored == {"address": info["address"], "public_key": GENUINE_KEY, "ttl_s": 5}  # and the beat it promises


def test_secure_etcd_across_two_namespaces():
    """The two-host set-up: etcd (TLS, auth) inside the prefill namespace, set up from inside it; a
    process in the decode namespace registers and looks up over the veth link with the settings
    that :meth:`EtcdServer.client_env` hands to child processes; without them it is refused."""
    from .conftest import netns_why

    from tests.testbed import HostPair

    if netns_why():
        pytest.skip(f"cannot create network namespaces: {netns_why()}")
    if ETCD_WHY:
        pytest.skip(ETCD_WHY)
    pytest.importorskip("cryptography", reason="the throwaway CA needs `cryptography` (kvpolicy[transfer])")
    code = (
        "import sys\n"
        "from kvpolicy.transports.discovery import EtcdRegistry, RegistryError\n"
        "try:\n"
        "    r = EtcdRegistry(sys.argv[1], namespace='hosts')\n"
        "    r.register('prefill', {'address': 'tcp://10.231.7.1:5000', 'agent': 'a'}, ttl_s=5)\n"
        "    print(r.lookup('prefill', timeout_s=5).address)\n"
        "except (RegistryError, ValueError) as exc:\n"
        "    print(type(exc).__name__)\n"
    )
    with HostPair() as pair, EtcdServer(pair.prefill.address, netns=pair.prefill.netns, secure=True) as etcd:
        assert etcd.endpoint.startswith("https://10.231.7.1:")
        with pytest.raises(RuntimeError, match="inside namespace"):
            etcd.client()  # from here it would not reach the namespace, and must not try

        def run_in_decode(env: dict[str, str]) -> str:
            command = ["ip", "netns", "exec", pair.decode.netns, sys.executable, "-c", code, etcd.endpoint]
            clean = {k: v for k, v in os.environ.items() if not k.startswith("KVPOLICY_ETCD_")}
            done = subprocess.run(command, env={**clean, **env}, capture_output=True, text=True, timeout=60)
            assert done.returncode == 0, done.stderr[-2000:]
            return done.stdout.strip()

        assert run_in_decode(etcd.client_env()) == "tcp://10.231.7.1:5000"
        tls_without_user = {k: v for k, v in etcd.client_env().items() if "USER" not in k and "PASSWORD" not in k}
        assert run_in_decode(tls_without_user) == "RegistryDenied"


# -- the key a record names is the key connect() uses (issue 26, item 1) -----------------------------


def keyed(endpoint: str, key: str) -> str:
    """A transceiver's kind of address: tcp://HEX@host:port, HEX being ``key`` (Z85) in hex."""
    pytest.importorskip("zmq")
    from kvpolicy.transports.addresses import address_with_key

    return address_with_key(endpoint, key.encode())


def test_a_record_whose_address_carries_another_key_than_it_names_is_never_returned(etcd):
    """The attacker holds write access (a compromised rank whose own key the decoder allow-lists)
    and keeps the trusted sender's public_key while the address carries the attacker's key: the
    decoder checked one key and connect() would have used the other. lookup() never returns it."""
    from kvpolicy.transports.addresses import split_address

    genuine = RankRecord(keyed("tcp://127.0.0.1:5555", GENUINE_KEY))  # public_key filled from the address
    assert genuine.public_key == GENUINE_KEY
    forged = json.dumps({"address": keyed("tcp://127.0.0.1:6666", ROGUE_KEY), "public_key": GENUINE_KEY}).encode()
    registry = EtcdRegistry(etcd.endpoint, security=etcd.security, namespace="mismatch")
    attacker = etcd.client()
    with registry:
        key = registry.key("prefill-0")
        attacker.put(key, forged)  # no genuine owner yet: the forgery stays
        for trusted in ([GENUINE_KEY], [GENUINE_KEY, ROGUE_KEY], None):
            with pytest.raises(InvalidRecord, match="carries public key [0-9a-f]{16} but public_key names") as refused:
                registry.lookup("prefill-0", timeout_s=0.4, trusted_keys=trusted)
            assert refused.value.reason == "key-mismatch"
        assert registry.skipped["key-mismatch"] >= 3
        assert registry.list() == {}  # list() skips it too, and says why
        assert "carries public key" in registry.last_skipped["prefill-0"]
        with pytest.raises(InvalidRecord, match="carries public key"):
            registry.get("prefill-0")
        # With its owner alive, the forgery is written over by the keep-alive; the honest record is
        # what lookups return, and its address carries the trusted key.
        registration = registry.register("prefill-0", genuine, ttl_s=1)
        attacker.put(key, forged)
        record = registry.lookup("prefill-0", timeout_s=10.0, trusted_keys=[GENUINE_KEY])
        assert record == genuine
        assert split_address(record.address)[1] == GENUINE_KEY.encode()
        wait_until(lambda: registration.restorations >= 1)
        assert "tcp://" in registration.last_foreign and "6666" in registration.last_foreign


# -- etcd users per role (issue 26, item 2) --------------------------------------------------------


@pytest.fixture(scope="module")
def split_etcd():
    """A secure etcd with a user per side on namespace "split": kvpolicy-prefill may read and write
    /kvpolicy/split/ranks/, kvpolicy-decode may only read it; nothing else exists for them."""
    server = start_server(roles="split", namespace="split")
    try:
        yield server
    finally:
        server.close()


def test_the_decode_role_looks_up_but_cannot_register_change_or_revoke(split_etcd):
    users = split_etcd.users
    assert {side: u.user for side, u in users.items()} == {"prefill": "kvpolicy-prefill", "decode": "kvpolicy-decode"}
    assert EtcdSecurity.from_env(split_etcd.client_env("decode")) == users["decode"]  # what a decode host gets
    prefill = EtcdRegistry(split_etcd.endpoint, security=users["prefill"], namespace="split")
    decode = EtcdRegistry(split_etcd.endpoint, security=users["decode"], namespace="split")
    with prefill:
        registration = prefill.register("prefill-0", GENUINE, ttl_s=5)  # a sender registers
        assert decode.lookup("prefill-0", timeout_s=1.0, trusted_keys=[GENUINE_KEY]) == GENUINE
        assert decode.list() == {"prefill-0": GENUINE}
        with pytest.raises(RegistryDenied, match="permission denied"):
            decode.register("decode-0", ROGUE, ttl_s=5)
        key = registration.key
        for attempt in (
            lambda: decode.client.put(key, ROGUE.to_json()),  # garble or redirect the sender's record
            lambda: decode.client.delete(key),  # or withdraw it
            lambda: decode.client.revoke(registration.lease),  # or revoke its lease (etcd needs write on its keys)
            lambda: decode.client.restore_if_changed(key, ROGUE.to_json(), mod_revision=0),  # or a transaction
        ):
            with pytest.raises(RegistryDenied, match="permission denied"):
                attempt()
        renewals = registration.renewals
        wait_until(lambda: registration.renewals > renewals)
        assert registration.restorations == 0 and prefill.get("prefill-0") == GENUINE
        # Neither role reaches another namespace, nor NIXL's metadata keys (not under /kvpolicy/).
        for registry in (prefill, decode):
            with pytest.raises(RegistryDenied, match="permission denied"):
                EtcdRegistry(split_etcd.endpoint, security=registry.client.security, namespace="other").list()
            with pytest.raises(RegistryDenied, match="permission denied"):
                registry.client.get(nixl_metadata_key("prefill-0"))
        with pytest.raises(RegistryDenied, match="permission denied"):
            prefill.client.put(nixl_metadata_key("prefill-0"), b"metadata")


def test_what_a_read_only_role_can_still_do_with_leases(split_etcd):
    """etcd 3.4 checks no permission on lease grant and keep-alive, and a reader sees each record's
    lease id: a decode user can still keep a dead sender's record in etcd past its TTL, and grant
    leases. That no longer keeps the rank live for readers: the record stops changing when its
    sender stops rewriting it, and a reader skips it once it is unchanged past the ttl_s it promises
    (``stale``). Revoking needs write permission on the lease's keys, so it cannot take a live record away."""
    prefill = EtcdRegistry(split_etcd.endpoint, security=split_etcd.users["prefill"], namespace="split")
    decode = EtcdRegistry(split_etcd.endpoint, security=split_etcd.users["decode"], namespace="split")
    with prefill:
        registration = prefill.register("leased", GENUINE, ttl_s=1)
        lease = int(decode.client.get_entry(registration.key)["lease"])
        assert lease == registration.lease
        assert decode.client.grant(5) > 0
        with pytest.raises(RegistryDenied, match="permission denied"):
            decode.client.revoke(lease)
        assert decode.list()["leased"] == GENUINE
        # The sender dies without clean-up (its keep-alive thread stops; nobody revokes the lease),
        # and the decode user keeps the lease alive: each check below is a keep-alive too.
        registration._stop.set()
        registration._thread.join(5)
        try:
            wait_until(lambda: decode.client.keepalive(lease) > 0 and "leased" not in decode.list())
            assert "has not been rewritten" in decode.last_skipped["leased"]
            assert int(decode.client.get_entry(registration.key)["lease"]) == lease  # the key is still there
            with pytest.raises(InvalidRecord, match="past the ttl_s of 1 it promises") as stale:
                decode.lookup("leased", timeout_s=0.5)
            assert stale.value.reason == "stale"
        finally:
            prefill.client.revoke(lease)


def test_per_sender_users_confine_each_sender_to_its_own_record(split_etcd):
    """What closes the remaining exposure of the prefill role (write on every sender's record): a
    user per sender whose role may write exactly its own key (etcd 3.4 grants a single key as well
    as a prefix). It registers and keeps its record; it cannot touch a neighbour's."""
    ranks = split_etcd.ranks_prefix("split")
    own = {
        name: split_etcd.add_user(f"kvpolicy-{name}", f"{name}-pw", ranks + name, "READWRITE", role=f"kvpolicy-{name}", exact=True)
        for name in ("prefill-a", "prefill-b")
    }
    a = EtcdRegistry(split_etcd.endpoint, security=own["prefill-a"], namespace="split")
    b = EtcdRegistry(split_etcd.endpoint, security=own["prefill-b"], namespace="split")
    decode = EtcdRegistry(split_etcd.endpoint, security=split_etcd.users["decode"], namespace="split")
    with a, b:
        registration = a.register("prefill-a", GENUINE, ttl_s=1)
        b.register("prefill-b", ROGUE, ttl_s=5)
        time.sleep(1.5)  # keep-alive rounds (lease keep-alive and the compare-and-swap) pass with the one key
        assert registration.renewals >= 2 and not registration.last_error
        with pytest.raises(RegistryDenied, match="permission denied"):
            b.client.put(a.key("prefill-a"), ROGUE.to_json())
        with pytest.raises(RegistryDenied, match="permission denied"):
            b.client.revoke(registration.lease)
        with pytest.raises(RegistryDenied, match="permission denied"):
            b.register("prefill-bb", ROGUE, ttl_s=5)  # one key, not a prefix: no look-alike names
        with pytest.raises(RegistryDenied, match="permission denied"):
            b.client.get(a.key("prefill-a"))  # a sender needs no one else's record
        assert decode.lookup("prefill-a", timeout_s=1.0, trusted_keys=[GENUINE_KEY]) == GENUINE
        assert decode.lookup("prefill-b", timeout_s=1.0, trusted_keys=[ROGUE_KEY]) == ROGUE


# -- a name is bound to its allow-list key (issue 41) ----------------------------------------------


class _Names:
    """An allow-list as a lookup sees it: key_of(name) -> the Z85 key of NAME.key, or None."""

    def __init__(self, **keys: str) -> None:
        self.keys = {name.replace("_", "-"): key.encode() for name, key in keys.items()}

    def key_of(self, name: str) -> bytes | None:
        return self.keys.get(name)


def test_a_lookup_bound_to_the_allow_list_follows_a_name_only_to_its_own_key(etcd):
    """The rogue holds an allowed key of its own (prefill-1) and write access; it writes the record of
    prefill-0 with its own key. Bound lookups skip it whether or not trusted_keys lists both senders,
    and return the honest record once its owner restores it; a name without a key file is never followed."""
    allowed = _Names(prefill_0=GENUINE_KEY, prefill_1=ROGUE_KEY)
    registry = EtcdRegistry(etcd.endpoint, security=etcd.security, namespace="bound", allowed=allowed)
    attacker = etcd.client()
    with registry:
        key = registry.key("prefill-0")
        attacker.put(key, ROGUE.to_json())
        for trusted in (None, [GENUINE_KEY, ROGUE_KEY]):
            with pytest.raises(InvalidRecord, match="the allow-list's prefill-0.key is") as refused:
                registry.lookup("prefill-0", timeout_s=0.4, trusted_keys=trusted)
            assert refused.value.reason == "name-key-mismatch"
        assert registry.skipped["name-key-mismatch"] >= 2
        # The same record under the rogue's own name is followed: it is that sender's.
        attacker.put(registry.key("prefill-1"), ROGUE.to_json())
        assert registry.lookup("prefill-1", timeout_s=1.0) == ROGUE
        # trusted_keys never widens: the honest name with only the rogue trusted is refused too.
        registration = registry.register("prefill-0", GENUINE, ttl_s=1)
        with pytest.raises(InvalidRecord) as narrowed:
            registry.lookup("prefill-0", timeout_s=0.4, trusted_keys=[ROGUE_KEY])
        assert narrowed.value.reason == "untrusted"
        attacker.put(key, ROGUE.to_json())  # the owner's keep-alive restores its record
        assert registry.lookup("prefill-0", timeout_s=10.0) == GENUINE
        assert registration.restorations >= 1
        attacker.put(registry.key("prefill-9"), GENUINE.to_json())
        with pytest.raises(InvalidRecord) as unnamed:
            registry.lookup("prefill-9", timeout_s=0.4)
        assert unnamed.value.reason == "name-not-allowed"
    # Per call, an allow-list given to lookup() binds a registry made without one.
    with EtcdRegistry(etcd.endpoint, security=etcd.security, namespace="bound") as plain:
        attacker.put(plain.key("prefill-0"), ROGUE.to_json())
        with pytest.raises(InvalidRecord, match="name-key-mismatch|allow-list"):
            plain.lookup("prefill-0", timeout_s=0.4, allowed=allowed)


# -- a dead sender's lease kept alive by a reader (issue 38, item 8) -------------------------------

#: A sender in a process of its own: registers one record with the prefill user's settings from the
#: environment, prints its lease id, then beats until it is killed.
SENDER = (
    "import sys, time\n"
    "from kvpolicy.transports.discovery import EtcdRegistry, RankRecord\n"
    "endpoint, name, address, key, ttl_s = sys.argv[1:]\n"
    "registry = EtcdRegistry(endpoint, namespace='split')\n"
    "registration = registry.register(name, RankRecord(address, key), ttl_s=int(ttl_s))\n"
    "print(registration.lease, flush=True)\n"
    "time.sleep(600)\n"
)


@contextlib.contextmanager
def sender_process(server: EtcdServer, name: str, record: RankRecord, ttl_s: int):
    """A sender registered from a child process as the prefill user: yields ``(process, lease)``;
    killed at the end whatever happened."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("KVPOLICY_ETCD_")}
    command = [sys.executable, "-c", SENDER, server.endpoint, name, record.address, record.public_key or "", str(ttl_s)]
    child = subprocess.Popen(command, env={**clean, **server.client_env("prefill")}, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None and child.stderr is not None
        line = child.stdout.readline()
        assert line.strip().isdigit(), f"the sender did not register: {line!r} {child.stderr.read()[-2000:] if child.poll() is not None else ''}"
        yield child, int(line)
    finally:
        if child.poll() is None:
            os.kill(child.pid, signal.SIGCONT)  # a stopped child must run to die cleanly
            child.kill()
        child.wait(10)
        child.stdout.close()  # type: ignore[union-attr]
        child.stderr.close()  # type: ignore[union-attr]


@contextlib.contextmanager
def lease_kept_alive(client: EtcdClient, lease: int, every_s: float = 0.3):
    """The attack: keep ``lease`` alive every ``every_s`` from a thread; yields the TTLs etcd answered."""
    answers: list[int] = []
    stop = threading.Event()

    def keep() -> None:
        while not stop.wait(every_s):
            with contextlib.suppress(RegistryError):
                answers.append(client.keepalive(lease))

    thread = threading.Thread(target=keep, name="test-lease-keeper", daemon=True)
    thread.start()
    try:
        yield answers
    finally:
        stop.set()
        thread.join(5)


class Events:
    """What a watch reported, each with the monotonic time it arrived."""

    def __init__(self) -> None:
        self.seen: list[tuple[float, dict[str, RankRecord], set[str]]] = []

    def __call__(self, changed: dict[str, RankRecord], gone: set[str]) -> None:
        self.seen.append((time.monotonic(), dict(changed), set(gone)))

    def appeared(self, name: str, after: float = 0.0) -> float | None:
        return next((t for t, changed, _ in self.seen if name in changed and t >= after), None)

    def gone(self, name: str, after: float = 0.0) -> float | None:
        return next((t for t, _, gone in self.seen if name in gone and t >= after), None)


def test_a_dead_senders_lease_kept_alive_by_the_decode_user_no_longer_keeps_it_live(split_etcd):
    """The attack end to end: a sender registers from its own process (ttl_s=2) and is SIGKILLed while
    the read-only decode user keeps its lease alive every 0.3 s. The key stays in etcd long past its
    TTL (the lease attack itself still works), yet the decode side's watch reports the rank gone
    within ttl_s and a poll of the kill, a lookup refuses it as ``stale`` and list() leaves it out.
    A live sender watched over the same window is never reported gone."""
    ttl_s, poll_s = 2, 0.1
    prefill = EtcdRegistry(split_etcd.endpoint, security=split_etcd.users["prefill"], namespace="split")
    decode = EtcdRegistry(split_etcd.endpoint, security=split_etcd.users["decode"], namespace="split")
    events = Events()
    with prefill, sender_process(split_etcd, "beat-dead", GENUINE, ttl_s) as (child, lease):
        live = prefill.register("beat-live", ROGUE, ttl_s=ttl_s)
        watch = decode.watch(events, poll_s=poll_s)
        try:
            wait_until(lambda: events.appeared("beat-dead") is not None and events.appeared("beat-live") is not None)
            with lease_kept_alive(decode.client, lease) as kept:
                renewals = live.renewals
                child.kill()
                killed = time.monotonic()
                child.wait(10)
                wait_until(lambda: events.gone("beat-dead") is not None, timeout_s=ttl_s + poll_s + 10)
                gone_after = events.gone("beat-dead") - killed  # type: ignore[operator]
                print(f"\nkill -> reported gone: {gone_after:.2f}s (ttl_s={ttl_s}, poll_s={poll_s})")
                # The protocol's bound: the last beat is at most ttl_s/3 before the kill, the rank is gone
                # once its revision is ttl_s old on the reader's clock, plus a poll; the rest is slack.
                assert gone_after < ttl_s + poll_s + 2.0
                with pytest.raises(InvalidRecord, match="'beat-dead' has not been rewritten for .* past the ttl_s of 2") as stale:
                    decode.lookup("beat-dead", timeout_s=1.0)
                assert stale.value.reason == "stale" and decode.skipped["stale"] >= 1
                ranks = decode.list()
                assert "beat-dead" not in ranks and ranks["beat-live"] == ROGUE
                assert "has not been rewritten" in decode.last_skipped["beat-dead"]
                # A reader that never saw the record before takes it at first sight (the handshake
                # then fails), and knows it stale once it has watched it unchanged for ttl_s.
                newcomer = EtcdRegistry(split_etcd.endpoint, security=split_etcd.users["decode"], namespace="split")
                assert newcomer.lookup("beat-dead", timeout_s=1.0) == GENUINE
                wait_until(lambda: "beat-dead" not in newcomer.list(), timeout_s=ttl_s + 5)
                with pytest.raises(InvalidRecord) as late:
                    newcomer.lookup("beat-dead", timeout_s=0.5)
                assert late.value.reason == "stale"
                wait_until(lambda: time.monotonic() > killed + 3 * ttl_s, timeout_s=3 * ttl_s + 1)
                entry = decode.client.get_entry(decode.key("beat-dead"))
                assert entry is not None and int(entry["lease"]) == lease, "the lease attack stopped working: rethink this test"
                assert kept and all(ttl > 0 for ttl in kept)
                assert "beat-dead" not in decode.list()
            assert events.gone("beat-live") is None  # no false staleness for a sender that beats
            assert live.renewals >= renewals + 3 and live.restorations == 0 and not live.last_error
            assert events.appeared("beat-dead", after=killed) is None
        finally:
            watch.stop()
            with contextlib.suppress(RegistryError):
                prefill.client.revoke(lease)


def test_a_sender_that_stops_beating_is_stale_and_back_when_it_beats_again(split_etcd):
    """A sender process paused (SIGSTOP) while its lease is kept alive: readers see it stale (the
    watch reports it gone, a lookup waits); resumed (SIGCONT), it beats within ttl_s/3 and the
    waiting lookup returns it, and the watch reports it again."""
    ttl_s, poll_s = 2, 0.1
    decode = EtcdRegistry(split_etcd.endpoint, security=split_etcd.users["decode"], namespace="split")
    events = Events()
    with sender_process(split_etcd, "beat-paused", GENUINE, ttl_s) as (child, lease):
        watch = decode.watch(events, poll_s=poll_s)
        try:
            wait_until(lambda: events.appeared("beat-paused") is not None)
            with lease_kept_alive(decode.client, lease):
                os.kill(child.pid, signal.SIGSTOP)
                paused = time.monotonic()
                wait_until(lambda: events.gone("beat-paused") is not None, timeout_s=ttl_s + poll_s + 10)
                found: list[RankRecord | BaseException] = []

                def look() -> None:
                    try:
                        found.append(decode.lookup("beat-paused", timeout_s=30.0))
                    except BaseException as exc:  # noqa: BLE001  (handed to the test thread)
                        found.append(exc)

                waiter = threading.Thread(target=look)
                skipped = decode.skipped["stale"]
                waiter.start()
                wait_until(lambda: decode.skipped["stale"] > skipped + 1)  # it is waiting, skipping the stale record
                assert not found
                os.kill(child.pid, signal.SIGCONT)
                resumed = time.monotonic()
                waiter.join(30)
                assert found == [GENUINE]
                print(f"\npaused {resumed - paused:.2f}s; waiting lookup returned {time.monotonic() - resumed:.2f}s after SIGCONT")
                wait_until(lambda: events.appeared("beat-paused", after=resumed) is not None)
        finally:
            watch.stop()
