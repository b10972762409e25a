"""Key files on disk (issue 26): secrets private from the first moment, permissions checked as ssh
checks them, allow-list directories followed by contents at once, and roles.

These tests use real files; the race test uses a real second user (``nobody``, by ``setuid`` in a
forked child), so it needs root and skips, saying so, elsewhere.
"""

from __future__ import annotations

import json
import logging
import mmap
import os
import shutil
import stat
import struct
import tempfile
import time

import pytest

from kvpolicy.cli import main
from kvpolicy.transports import AllowList, Identity, KeyMaterialError, create_keys
from kvpolicy.transports import keys as keys_module

IS_ROOT = hasattr(os, "geteuid") and os.geteuid() == 0


def _nobody():
    import pwd

    try:
        return pwd.getpwnam("nobody")
    except KeyError:
        return None


NOBODY = _nobody()
needs_root = pytest.mark.skipif(
    not IS_ROOT or NOBODY is None,
    reason="needs root and a `nobody` user: it acts as another local user (setuid, chown)",
)


def _public(path) -> bytes:
    return Identity.load(path).public if str(path).endswith("_secret") else AllowList([path]).entries()[0].public


# -- creation -------------------------------------------------------------------------------------


@needs_root
def test_another_user_never_opens_a_secret_while_keys_are_made():
    """A child turned `nobody` spins on the next secret's name while the parent makes 200 pairs in a
    folder it may enter: it sees every secret appear (so the race is real) and opens none. Writing
    the file and chmod-ing it afterwards (what pyzmq alone does) loses this race about a third of the
    time per key."""
    count = 200
    folder = tempfile.mkdtemp(prefix="kvpolicy-race-")
    os.chmod(folder, 0o755)  # others may enter and read, as an allow-list folder often allows
    shared = mmap.mmap(-1, 32)  # ready, stop, opened, seen: int64 each, shared across the fork
    try:
        pid = os.fork()
        if pid == 0:  # the other user
            try:
                os.setgroups([])
                os.setgid(NOBODY.pw_gid)
                os.setuid(NOBODY.pw_uid)
                n = opened = seen = 0
                shared[0:8] = struct.pack("q", 1)
                while n < count and struct.unpack("q", shared[8:16])[0] == 0:
                    try:
                        fd = os.open(f"{folder}/k{n:03d}.key_secret", os.O_RDONLY)
                    except FileNotFoundError:
                        continue
                    except PermissionError:
                        seen, n = seen + 1, n + 1
                        continue
                    os.close(fd)  # an open descriptor reads whatever is written later: a leak
                    opened, seen, n = opened + 1, seen + 1, n + 1
                shared[16:32] = struct.pack("qq", opened, seen)
            finally:
                os._exit(0)
        deadline = time.monotonic() + 10
        while struct.unpack("q", shared[0:8])[0] == 0 and time.monotonic() < deadline:
            time.sleep(0.001)
        for i in range(count):
            create_keys(folder, f"k{i:03d}", "prefill" if i % 2 else None)
        time.sleep(0.05)
        shared[8:16] = struct.pack("q", 1)
        os.waitpid(pid, 0)
        opened, seen = struct.unpack("qq", shared[16:32])
        assert seen == count, f"the other user saw {seen} of {count} secrets appear: the race did not run"
        assert opened == 0, f"another user opened {opened} of {count} secrets while they were made"
        assert sorted(os.listdir(folder)) == sorted(f"k{i:03d}.key{s}" for i in range(count) for s in ("", "_secret"))
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def test_keys_are_made_0600_and_0644_in_a_private_folder_and_not_overwritten_unless_asked(tmp_path):
    folder = tmp_path / "new" / "keys"
    public, secret = create_keys(folder, "p0", "prefill")
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    assert stat.S_IMODE(secret.stat().st_mode) == 0o600
    assert stat.S_IMODE(public.stat().st_mode) == 0o644
    assert sorted(os.listdir(folder)) == ["p0.key", "p0.key_secret"]  # no scratch folder left behind
    first = Identity.load(secret)
    with pytest.raises(KeyMaterialError, match=r"p0\.key_secret: a key named 'p0' exists already; pass --force"):
        create_keys(folder, "p0", "prefill", overwrite=False)
    assert Identity.load(secret) == first and _public(public) == first.public  # untouched
    (folder / "p0.key_secret").unlink()  # a public file alone also blocks, and nothing is left half made
    with pytest.raises(KeyMaterialError, match=r"p0\.key: a key named 'p0' exists already"):
        create_keys(folder, "p0", overwrite=False)
    assert sorted(os.listdir(folder)) == ["p0.key"]
    create_keys(folder, "p0", "decode")  # overwrite=True by default
    again = Identity.load(folder / "p0.key_secret")
    assert again.public != first.public and again.role == "decode" and _public(public) == again.public
    with pytest.raises(KeyMaterialError, match="key role 'admin'"):
        create_keys(folder, "q", "admin")


def test_key_files_stay_readable_by_pyzmq_with_or_without_a_role(tmp_path):
    import zmq.auth

    for name, role in (("p", "prefill"), ("d", "decode"), ("x", None)):
        public, secret = create_keys(tmp_path, name, role)
        me = Identity.load(secret)
        assert zmq.auth.load_certificate(str(public)) == (me.public, None)
        assert zmq.auth.load_certificate(str(secret)) == (me.public, me.secret)
        assert me.role == role and AllowList([public]).entries()[0].role == role


# -- ssh-like checks ------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", [0o644, 0o640, 0o604, 0o610])
def test_a_secret_group_or_others_may_access_is_refused_with_the_fix(tmp_path, mode):
    _, secret = create_keys(tmp_path, "me")
    os.chmod(secret, mode)
    with pytest.raises(KeyMaterialError) as caught:
        Identity.load(secret)
    message = str(caught.value)
    assert "UNPROTECTED PRIVATE KEY FILE" in message and f"mode {mode:04o}" in message
    assert f"`chmod 600 {secret}`" in message
    os.chmod(secret, 0o400)
    assert Identity.load(secret).name == "me"


@needs_root
def test_a_secret_another_user_owns_is_refused(tmp_path):
    _, secret = create_keys(tmp_path, "me")
    os.chown(secret, NOBODY.pw_uid, NOBODY.pw_gid)
    with pytest.raises(KeyMaterialError, match=r"owned by nobody .*`chown 0 .*me\.key_secret`"):
        Identity.load(secret)
    os.chown(secret, 0, 0)
    assert Identity.load(secret).name == "me"


@pytest.mark.parametrize("mode", [0o775, 0o757, 0o777, 0o1777])
def test_an_allow_list_directory_others_may_write_is_refused(tmp_path, mode):
    folder = tmp_path / "peers"
    create_keys(folder, "a")
    os.chmod(folder, mode)
    with pytest.raises(KeyMaterialError) as caught:
        AllowList(folder)
    message = str(caught.value)
    assert str(folder) in message and f"mode {mode & 0o7777:04o}" in message and f"`chmod go-w {folder}`" in message
    os.chmod(folder, 0o755)
    assert len(AllowList(folder)) == 1


@needs_root
def test_an_allow_list_directory_another_user_owns_is_refused(tmp_path):
    folder = tmp_path / "peers"
    create_keys(folder, "a")
    os.chown(folder, NOBODY.pw_uid, NOBODY.pw_gid)
    with pytest.raises(KeyMaterialError, match=rf"{folder} is owned by nobody"):
        AllowList(folder)


def test_a_directory_that_turns_writable_is_no_longer_trusted_until_fixed(tmp_path, caplog):
    a = Identity.load(create_keys(tmp_path, "a")[1])
    allowed = AllowList(tmp_path)
    assert allowed.name_of(a.public) == "a"
    os.chmod(tmp_path, 0o777)
    with caplog.at_level(logging.ERROR, logger="kvpolicy.transports"):
        assert allowed.name_of(a.public) is None
        assert allowed.name_of(a.public) is None  # logged once, not per handshake
    assert allowed.key_of("a") is None and not allowed.contains(a.public) and len(allowed) == 0
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1 and f"chmod go-w {tmp_path}" in errors[0] and "no peer is allowed" in errors[0]
    assert allowed.refresh() == {a.public}
    os.chmod(tmp_path, 0o700)
    assert allowed.name_of(a.public) == "a" and allowed.refresh() == frozenset()


def test_a_key_file_others_may_write_is_skipped_with_a_warning(tmp_path, caplog):
    a = Identity.load(create_keys(tmp_path, "a")[1])
    b_public, b_secret = create_keys(tmp_path, "b")
    b = Identity.load(b_secret)
    os.chmod(b_public, 0o666)
    with caplog.at_level(logging.WARNING, logger="kvpolicy.transports"):
        allowed = AllowList(tmp_path)
    assert allowed.name_of(a.public) == "a" and allowed.name_of(b.public) is None and allowed.key_of("b") is None
    assert any(f"{b_public} is writable by group and others" in r.getMessage() and f"chmod go-w {b_public}" in r.getMessage() for r in caplog.records)
    with pytest.raises(KeyMaterialError, match=rf"`chmod go-w {b_public}`"):
        AllowList([b_public])  # named on its own: refused
    os.chmod(b_public, 0o644)
    assert allowed.name_of(b.public) == "b"


# -- following the directory by contents ----------------------------------------------------------


def test_a_removed_key_is_a_stranger_at_once(tmp_path):
    a_public, a_secret = create_keys(tmp_path, "a")
    b_public, b_secret = create_keys(tmp_path, "b")
    a, b = Identity.load(a_secret), Identity.load(b_secret)
    allowed = AllowList(tmp_path)
    version = allowed.version
    assert allowed.name_of(b.public) == "b" and allowed.contains(b.public)
    b_public.unlink()
    assert allowed.name_of(b.public) is None  # at once: no sleep, no mtime trick
    assert not allowed.contains(b.public) and allowed.key_of("b") is None and allowed.version > version
    assert allowed.refresh() == {b.public}  # the name_of that saw it first does not hide it
    assert allowed.refresh() == frozenset()
    a_public.unlink()
    assert allowed.contains(a.public)  # cached: contains does no I/O
    assert allowed.refresh() == {a.public} and not allowed.contains(a.public) and len(allowed) == 0
    assert allowed.watches_directory
    fixed = AllowList([b])
    assert not fixed.watches_directory and fixed.refresh() == frozenset() and fixed.name_of(b.public) == "b"


def test_a_key_added_and_removed_between_refreshes_is_still_reported(tmp_path):
    create_keys(tmp_path, "a")
    allowed = AllowList(tmp_path)
    allowed.refresh()
    c = Identity.load(create_keys(tmp_path, "c")[1])
    assert allowed.name_of(c.public) == "c"  # a handshake let it in
    (tmp_path / "c.key").unlink()
    assert allowed.refresh() == {c.public}


def test_a_key_made_again_under_the_same_name_is_read_at_once_whatever_the_folder_mtime(tmp_path):
    create_keys(tmp_path, "a")
    old = Identity.load(create_keys(tmp_path, "b")[1])
    allowed = AllowList(tmp_path)
    assert allowed.key_of("b") == old.public
    before = os.stat(tmp_path)
    new = Identity.load(create_keys(tmp_path, "b")[1])
    os.utime(tmp_path, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert os.stat(tmp_path).st_mtime_ns == before.st_mtime_ns
    assert allowed.key_of("b") == new.public
    assert allowed.name_of(new.public) == "b" and allowed.name_of(old.public) is None
    assert allowed.refresh() == {old.public}


def test_a_key_file_rewritten_in_place_with_old_times_is_read_again(tmp_path):
    b_public, _ = create_keys(tmp_path, "b")
    elsewhere = tmp_path / "elsewhere"
    other_public, other_secret = create_keys(elsewhere, "b")
    other = Identity.load(other_secret)
    allowed = AllowList(tmp_path)
    old = allowed.key_of("b")
    time.sleep(keys_module._RACY_NS / 1e9 + 0.05)  # past the window where a recent file is read again anyway
    assert allowed.refresh() == frozenset()  # ... and read once after it: from now on only its signature counts
    file_times, folder_times = os.stat(b_public), os.stat(tmp_path)
    content = other_public.read_bytes()
    assert len(content) == file_times.st_size
    with open(b_public, "r+b") as file:  # same inode, same size
        file.write(content)
    os.utime(b_public, ns=(file_times.st_atime_ns, file_times.st_mtime_ns))
    os.utime(tmp_path, ns=(folder_times.st_atime_ns, folder_times.st_mtime_ns))
    assert os.stat(b_public).st_ino == file_times.st_ino
    assert allowed.key_of("b") == other.public and allowed.name_of(old) is None


def test_only_changed_files_are_read_again(tmp_path, monkeypatch):
    for name in ("a", "b", "c"):
        create_keys(tmp_path, name)
    allowed = AllowList(tmp_path)
    time.sleep(keys_module._RACY_NS / 1e9 + 0.05)
    allowed.refresh()
    reads = []
    real = keys_module._read_certificate
    monkeypatch.setattr(keys_module, "_read_certificate", lambda path: reads.append(path.name) or real(path))
    stranger = Identity.generate().public
    for _ in range(3):
        assert allowed.name_of(stranger) is None
    assert reads == []
    os.utime(tmp_path / "b.key")
    assert allowed.name_of(stranger) is None
    assert reads == ["b.key"]


# -- roles ----------------------------------------------------------------------------------------


def test_roles_filter_name_of(tmp_path):
    p = Identity.load(create_keys(tmp_path, "p", "prefill")[1])
    d = Identity.load(create_keys(tmp_path, "d", "decode")[1])
    x = Identity.load(create_keys(tmp_path, "x", "any")[1])
    allowed = AllowList(tmp_path)
    assert (allowed.role_of(p.public), allowed.role_of(d.public), allowed.role_of(x.public)) == ("prefill", "decode", None)
    assert (p.role, d.role, x.role) == ("prefill", "decode", None)
    # a sender's control socket accepts decode (and role-less) keys only
    assert allowed.name_of(d.public, role="decode") == "d" and allowed.name_of(x.public, role="decode") == "x"
    assert allowed.name_of(p.public, role="decode") is None and not allowed.contains(p.public, role="decode")
    # a receiver connects to prefill (and role-less) keys only
    assert allowed.name_of(p.public, role="prefill") == "p" and allowed.name_of(d.public, role="prefill") is None
    assert allowed.name_of(p.public) == "p" and allowed.name_of(d.public) == "d"  # no role asked: any
    with pytest.raises(ValueError, match="role 'sender'"):
        allowed.name_of(p.public, role="sender")
    assert AllowList([p]).name_of(p.public, role="decode") is None  # an Identity keeps its role


def test_a_role_changed_in_place_is_reported_and_applied(tmp_path):
    d_public, d_secret = create_keys(tmp_path, "d", "decode")
    d = Identity.load(d_secret)
    allowed = AllowList(tmp_path)
    assert allowed.name_of(d.public, role="decode") == "d"
    d_public.write_text(d_public.read_text().replace("role = decode", "role = prefill"))
    assert allowed.name_of(d.public, role="decode") is None and allowed.role_of(d.public) == "prefill"
    assert allowed.refresh() == {d.public}  # still allowed, but not with the rights it had


def test_a_key_file_with_an_unknown_role_is_refused(tmp_path, caplog):
    public, _ = create_keys(tmp_path, "p", "prefill")
    public.write_text(public.read_text().replace("role = prefill", "role = admin"))
    with pytest.raises(KeyMaterialError, match=r"p\.key: role 'admin' is none of prefill, decode.*--role"):
        AllowList([public])
    with caplog.at_level(logging.WARNING, logger="kvpolicy.transports"):
        assert len(AllowList(tmp_path)) == 0
    assert any("role 'admin'" in r.getMessage() for r in caplog.records)


# -- the command line -----------------------------------------------------------------------------


def test_keys_new_needs_a_role_and_show_prints_it(tmp_path, capsys):
    with pytest.raises(SystemExit) as exited:
        main(["keys", "new", str(tmp_path), "--name", "x"])
    assert exited.value.code == 2 and "--role" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["keys", "new", str(tmp_path), "--name", "x", "--role", "sender"])
    capsys.readouterr()
    assert main(["keys", "new", str(tmp_path), "--name", "p0", "--role", "prefill"]) == 0
    out = capsys.readouterr().out
    assert "role prefill" in out and "copy p0.key into the allowed_peers directory of every decode rank" in out
    assert main(["keys", "new", str(tmp_path), "--name", "d0", "--role", "decode"]) == 0
    assert "every prefill rank" in capsys.readouterr().out
    assert main(["keys", "new", str(tmp_path), "--name", "t0", "--role", "any", "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["role"] == "any"
    assert "role =" not in (tmp_path / "t0.key").read_text()
    assert main(["keys", "show", str(tmp_path / "d0.key"), "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["role"] == "decode"
    assert main(["keys", "show", str(tmp_path / "p0.key_secret")]) == 0
    assert "role prefill" in capsys.readouterr().out
    assert Identity.load(tmp_path / "p0.key_secret").role == "prefill"
