"""Key material: `kvpolicy keys`, identities, allow-lists, addresses that carry a key."""

from __future__ import annotations

import json
import stat

import pytest

from kvpolicy.cli import main
from kvpolicy.transports import AllowList, Identity, KeyMaterialError, create_keys
from kvpolicy.transports.addresses import address_with_key, fingerprint, split_address


def test_keys_new_writes_a_pair_and_refuses_to_overwrite(tmp_path, capsys):
    assert main(["keys", "new", str(tmp_path), "--name", "decode-0", "--role", "decode", "--format", "json"]) == 0
    info = json.loads(capsys.readouterr().out)
    secret = tmp_path / "decode-0.key_secret"
    assert stat.S_IMODE(secret.stat().st_mode) == 0o600
    identity = Identity.load(secret)
    assert identity.name == "decode-0" and identity.public.decode() == info["public_key"]
    assert info["fingerprint"] == fingerprint(identity.public) and info["role"] == identity.role == "decode"
    assert main(["keys", "new", str(tmp_path), "--name", "decode-0", "--role", "decode"]) == 2
    assert "exists already; pass --force" in capsys.readouterr().err
    assert Identity.load(secret) == identity
    assert main(["keys", "new", str(tmp_path), "--name", "decode-0", "--role", "decode", "--force"]) == 0
    assert Identity.load(secret).public != identity.public
    assert main(["keys", "show", str(tmp_path / "decode-0.key")]) == 0
    assert main(["keys", "show", str(tmp_path / "missing.key")]) == 2


def test_allow_list_from_a_directory_picks_up_keys_added_later(tmp_path):
    create_keys(tmp_path, "a")
    allowed = AllowList(tmp_path)
    b = Identity.load(create_keys(tmp_path, "b")[1])
    assert allowed.name_of(b.public) == "b"
    assert allowed.key_of("b") == b.public
    assert allowed.name_of(Identity.generate().public) is None
    assert allowed.key_of("nobody") is None


def test_bad_key_material_is_refused_with_a_fix(tmp_path):
    with pytest.raises(KeyMaterialError, match="allowed_peers is required.*kvpolicy keys new"):
        AllowList(None)
    public, _ = create_keys(tmp_path, "p")
    with pytest.raises(KeyMaterialError, match="no secret key"):
        Identity.load(public)
    (tmp_path / "junk.key_secret").write_text("not a certificate")
    with pytest.raises(KeyMaterialError, match="kvpolicy keys new"):
        Identity.load(tmp_path / "junk.key_secret")
    with pytest.raises(KeyMaterialError, match="40 z85"):
        AllowList(["short"])


def test_an_address_carries_the_senders_key():
    me = Identity.generate()
    address = address_with_key("tcp://10.0.0.1:5555", me.public)
    assert split_address(address) == ("tcp://10.0.0.1:5555", me.public)
    assert split_address("tcp://10.0.0.1:5555") == ("tcp://10.0.0.1:5555", None)
    assert address.startswith("tcp://") and address.endswith("@10.0.0.1:5555")
    with pytest.raises(ValueError, match="public key"):
        split_address("tcp://zz@10.0.0.1:5555")
