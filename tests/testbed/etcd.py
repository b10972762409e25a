"""A throwaway etcd for tests and benchmarks: plain on loopback, or TLS-only with etcd's auth on.

:class:`EtcdServer` runs Debian's ``etcd-server`` with a temporary data dir on one address and free
ports; :meth:`~EtcdServer.stop` / :meth:`~EtcdServer.start` take it away mid-run and bring it back
with its data. With ``secure=True`` it serves only TLS, asks every client for a certificate
(``--client-cert-auth``), and has auth enabled with a user whose role covers ``/kvpolicy/`` only
(or, ``roles="split"``, a read-write user for senders and a read-only one for receivers on one
namespace's rank records); :func:`make_pki` writes the throwaway CA and certificates
(``cryptography``). Users and roles are made through the JSON gateway, as
:class:`~kvpolicy.transports.etcd_client.EtcdClient` speaks it: no ``etcdctl`` needed. Every wait has a finite timeout.
"""

from __future__ import annotations

import datetime
import http.client
import ipaddress
import json
import os
import secrets
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from kvpolicy.transports.etcd_client import EtcdClient, EtcdSecurity, b64, prefix_end

# The repository root: children started with `python -c` import this module from there.
_ROOT = str(Path(__file__).resolve().parents[2])

__all__ = ["EtcdPKI", "EtcdServer", "etcd_binary", "free_port", "make_pki"]


def etcd_binary() -> str | None:
    """Path of the ``etcd`` server binary, or None (install Debian's ``etcd-server``)."""
    return shutil.which("etcd") or next((p for p in ("/usr/bin/etcd", "/usr/local/bin/etcd") if os.access(p, os.X_OK)), None)


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free on ``host`` right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def _run(args: list[str], timeout: float = 10.0, check: bool = True, input: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(args, capture_output=True, text=True, timeout=timeout, check=check, input=input)


@dataclass(frozen=True)
class EtcdPKI:
    """PEM files of a throwaway CA, etcd's server certificate and one client certificate."""

    ca_file: str
    server_cert: str
    server_key: str
    client_cert: str
    client_key: str


def make_pki(directory: str, hosts: Sequence[str], *, client_name: str = "kvpolicy-client") -> EtcdPKI:
    """Write a CA, a server certificate for ``hosts`` (IP addresses or names) and a client
    certificate (``O=kvpolicy, OU=<client_name>``, no common name) under ``directory``; keys are
    P-256, valid one day.

    The server certificate also allows client use: etcd 3.4's JSON gateway dials etcd's own gRPC
    port with it when ``--client-cert-auth`` is on. The client certificate has no common name: etcd
    answers 400 to a gateway call made with one (it would otherwise stand for an etcd user).
    """
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    os.makedirs(directory, mode=0o700, exist_ok=True)
    now = datetime.datetime.now(datetime.timezone.utc)

    def name(common: str) -> x509.Name:
        # etcd refuses a gateway request whose client certificate has a common name (CVE-2018-16886:
        # it would be taken for a user), so client certificates name their holder as an organization.
        if common == client_name:
            return x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "kvpolicy"), x509.NameAttribute(NameOID.ORGANIZATIONAL_UNIT_NAME, common)])
        return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common)])

    def write(stem: str, key: ec.EllipticCurvePrivateKey, cert: x509.Certificate) -> tuple[str, str]:
        cert_path, key_path = os.path.join(directory, f"{stem}.pem"), os.path.join(directory, f"{stem}-key.pem")
        with open(cert_path, "wb") as f:
            f.write(cert.public_bytes(serialization.Encoding.PEM))
        fd = os.open(key_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
        return cert_path, key_path

    def issue(subject: str, issuer_key, *, ca: bool = False, usages=(), sans=()) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
        key = ec.generate_private_key(ec.SECP256R1())
        builder = (
            x509.CertificateBuilder()
            .subject_name(name(subject))
            .issuer_name(name("kvpolicy test CA") if not ca else name(subject))
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
        )
        if usages:
            builder = builder.add_extension(x509.ExtendedKeyUsage(list(usages)), critical=False)
        if sans:
            builder = builder.add_extension(x509.SubjectAlternativeName(list(sans)), critical=False)
        return key, builder.sign(key if ca else issuer_key, hashes.SHA256())

    ca_key, ca_cert = issue("kvpolicy test CA", None, ca=True)
    ca_file, _ = write("ca", ca_key, ca_cert)
    sans = []
    for host in dict.fromkeys([*hosts, "127.0.0.1", "localhost"]):
        try:
            sans.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            sans.append(x509.DNSName(host))
    server = issue("kvpolicy-etcd-server", ca_key, usages=(ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH), sans=sans)
    server_cert, server_key = write("server", *server)
    client = issue(client_name, ca_key, usages=(ExtendedKeyUsageOID.CLIENT_AUTH,))
    client_cert, client_key = write("client", *client)
    return EtcdPKI(ca_file, server_cert, server_key, client_cert, client_key)


class EtcdServer:
    """A single-member etcd on ``host`` with a temporary data dir.

    ``netns``: run it inside that network namespace (through ``ip netns exec``); ``host`` must then be
    an address of the namespace. ``secure``: TLS only (client certificates required), auth enabled
    with a ``root`` user and, with ``roles="shared"`` (the default), a user ``kvpolicy`` whose role may
    read and write ``/kvpolicy/`` and nothing else; :attr:`security` then holds that user's settings
    and :attr:`root` the root's. With ``roles="split"``, least exposure per side instead: a user and
    role ``kvpolicy-prefill`` that may read and write ``/kvpolicy/<namespace>/ranks/`` (senders
    register) and a user and role ``kvpolicy-decode`` that may only read it (receivers look up);
    :attr:`users` holds both (``"prefill"``, ``"decode"``), :attr:`security` the prefill user's, and
    :meth:`client_env` takes the side. ``token_ttl_s``: etcd's ``--auth-token-ttl``. Use as a
    context manager, or call :meth:`close`.
    """

    #: The key prefix the ``kvpolicy`` user's role covers.
    PREFIX = "/kvpolicy/"
    #: The two users (and roles) of ``roles="split"``, by side.
    SPLIT_USERS = {"prefill": ("kvpolicy-prefill", "READWRITE"), "decode": ("kvpolicy-decode", "READ")}

    def __init__(
        self,
        host: str = "127.0.0.1",
        *,
        netns: str | None = None,
        secure: bool = False,
        roles: str = "shared",
        namespace: str = "default",
        token_ttl_s: int | None = None,
        start_timeout_s: float = 20.0,
    ) -> None:
        if roles not in ("shared", "split"):
            raise ValueError(f"roles must be 'shared' or 'split', got {roles!r}")
        binary = etcd_binary()
        if binary is None:
            raise FileNotFoundError("the etcd binary is not installed (apt-get install etcd-server)")
        self.binary = binary
        self.host = host
        self.netns = netns
        self.secure = secure
        self.roles = roles
        self.namespace = namespace
        self.token_ttl_s = token_ttl_s
        self.start_timeout_s = start_timeout_s
        self.data_dir = tempfile.mkdtemp(prefix="kvpolicy-etcd-")
        self.client_port = free_port() if netns is None else 23790 + (os.getpid() % 97)
        self.peer_port = free_port() if netns is None else self.client_port + 100
        scheme = "https" if secure else "http"
        self.endpoint = f"{scheme}://{host}:{self.client_port}"
        self.pki: EtcdPKI | None = None
        self.security = EtcdSecurity(insecure_plaintext=True)
        self.root = self.security
        #: The etcd users made at start, by side ("kvpolicy" with roles="shared"; "prefill" and
        #: "decode" with roles="split"), and the files holding their passwords (mode 600).
        self.users: dict[str, EtcdSecurity] = {}
        self.password_files: dict[str, str] = {}
        self.password_file = ""
        self.process: subprocess.Popen | None = None
        self._log = open(os.path.join(self.data_dir, "etcd.log"), "ab")
        try:
            if secure:
                self.pki = make_pki(os.path.join(self.data_dir, "pki"), [host])
                tls = {"ca_file": self.pki.ca_file, "cert_file": self.pki.client_cert, "key_file": self.pki.client_key}
                self.root = EtcdSecurity(**tls, user="root", password=secrets.token_urlsafe(16))
                names = {"kvpolicy": "kvpolicy"} if roles == "shared" else {s: u for s, (u, _) in self.SPLIT_USERS.items()}
                for side, user in names.items():
                    self.users[side] = EtcdSecurity(**tls, user=user, password=secrets.token_urlsafe(16))
                    self.password_files[side] = os.path.join(self.data_dir, "pki", "password" if roles == "shared" else f"password-{side}")
                    fd = os.open(self.password_files[side], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
                    with os.fdopen(fd, "w") as f:
                        f.write(self.users[side].password or "")
                default = "kvpolicy" if roles == "shared" else "prefill"
                self.security, self.password_file = self.users[default], self.password_files[default]
            self.start()
            if secure:
                self._enable_auth()
        except BaseException:
            self.close()
            raise

    def _tls_args(self) -> list[str]:
        if self.pki is None:
            return []
        pki = self.pki
        return [
            "--cert-file", pki.server_cert, "--key-file", pki.server_key,
            "--client-cert-auth", "--trusted-ca-file", pki.ca_file,
            "--peer-cert-file", pki.server_cert, "--peer-key-file", pki.server_key,
            "--peer-client-cert-auth", "--peer-trusted-ca-file", pki.ca_file,
        ]  # fmt: skip

    def start(self) -> None:
        """Start (or restart, with the same data) the server and wait until it answers."""
        if self.process is not None and self.process.poll() is None:
            return
        peer = f"{'https' if self.secure else 'http'}://{self.host}:{self.peer_port}"
        args = [
            self.binary,
            "--name", "kvpolicy",
            "--data-dir", os.path.join(self.data_dir, "data"),
            "--listen-client-urls", self.endpoint,
            "--advertise-client-urls", self.endpoint,
            "--listen-peer-urls", peer,
            "--initial-advertise-peer-urls", peer,
            "--initial-cluster", f"kvpolicy={peer}",
            "--log-level", "error",
            *self._tls_args(),
        ]  # fmt: skip
        if self.token_ttl_s is not None:
            args += ["--auth-token-ttl", str(self.token_ttl_s)]
        if self.netns:
            args = ["ip", "netns", "exec", self.netns, *args]
        self.process = subprocess.Popen(args, stdout=self._log, stderr=self._log, start_new_session=True)
        deadline = time.monotonic() + self.start_timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"etcd exited with {self.process.returncode}; see {self._log.name}")
            if self.healthy(timeout_s=0.5):
                return
            time.sleep(0.05)
        self.stop()
        raise TimeoutError(f"etcd did not become healthy at {self.endpoint} within {self.start_timeout_s}s")

    def _enable_auth(self) -> None:
        """What an operator does once with ``etcdctl user add / role add / role grant-permission /
        user grant-role / auth enable``, through the JSON gateway (see the README)."""
        steps = [
            ("/v3/auth/user/add", {"name": "root", "password": self.root.password}),
            ("/v3/auth/role/add", {"name": "root"}),
            ("/v3/auth/user/grant", {"user": "root", "role": "root"}),
            *self._user_set_up(),
            ("/v3/auth/enable", {}),
        ]
        self._admin(steps, as_root=False)

    def _user_set_up(self) -> list[tuple[str, dict]]:
        if self.roles == "shared":
            return _user_steps("kvpolicy", self.users["kvpolicy"].password or "", self.PREFIX, "READWRITE")
        ranks = self.ranks_prefix(self.namespace)
        steps: list[tuple[str, dict]] = []
        for side, (user, permission) in self.SPLIT_USERS.items():
            steps += _user_steps(user, self.users[side].password or "", ranks, permission, role=user)
        return steps

    @staticmethod
    def ranks_prefix(namespace: str) -> str:
        """Where :class:`~kvpolicy.transports.discovery.EtcdRegistry` keeps ``namespace``'s rank records."""
        return f"/kvpolicy/{namespace}/ranks/"

    def add_user(
        self, user: str, password: str, prefix: str, permission: str = "READWRITE", *, role: str | None = None, exact: bool = False
    ) -> EtcdSecurity:
        """Create etcd user ``user`` with a role (``role``, default ``<user>-role``) that may
        ``permission`` (READ, WRITE or READWRITE) the keys under ``prefix`` (``exact``: that one key
        only); returns its settings (this server's client certificate)."""
        pki = self.pki
        if pki is None:
            raise RuntimeError("users exist only on a secure server (EtcdServer(secure=True))")
        self._admin(_user_steps(user, password, prefix, permission, role=role, exact=exact), as_root=True)
        return EtcdSecurity(pki.ca_file, pki.client_cert, pki.client_key, user=user, password=password)

    def _admin(self, steps: list[tuple[str, dict]], *, as_root: bool) -> None:
        # Inside a namespace the calls must be made from inside it: from here, the namespace's
        # address would be looked up in this host's routing table and leave the machine.
        pki = self.pki
        assert pki is not None
        payload = {
            "endpoint": self.endpoint,
            "tls": [pki.ca_file, pki.client_cert, pki.client_key],
            "root_password": self.root.password if as_root else None,
            "steps": steps,
        }
        if self.netns is None:
            _apply(payload)
            return
        code = f"import json,sys;sys.path.insert(0,{_ROOT!r});from tests.testbed.etcd import _apply;_apply(json.load(sys.stdin))"
        done = _run(["ip", "netns", "exec", self.netns, sys.executable, "-c", code], timeout=30, check=False, input=json.dumps(payload))
        if done.returncode != 0:
            raise RuntimeError(f"etcd set-up inside namespace {self.netns} failed: {done.stderr.strip()[-800:]}")

    def client(self, security: EtcdSecurity | None = None, *, timeout_s: float = 2.0) -> EtcdClient:
        """A client of this server as the ``kvpolicy`` user (or with ``security``). Not for a server
        inside a namespace: reach that one from a process inside the namespace (:meth:`client_env`)."""
        if self.netns is not None:
            raise RuntimeError(f"etcd runs inside namespace {self.netns}; make clients there (client_env())")
        return EtcdClient(self.endpoint, security=security or self.security, timeout_s=timeout_s)

    def client_env(self, side: str | None = None) -> dict[str, str]:
        """Environment for a child process whose clients read :meth:`EtcdSecurity.from_env`, as the
        user of ``side`` (a key of :attr:`users`; default: :attr:`security`'s user)."""
        if not self.secure or self.pki is None:
            return {"KVPOLICY_ETCD_INSECURE_PLAINTEXT": "1"}
        if side is not None and side not in self.users:
            raise KeyError(f"no etcd user for side {side!r} (roles={self.roles!r} has {sorted(self.users)})")
        security = self.security if side is None else self.users[side]
        return {
            "KVPOLICY_ETCD_CACERT": self.pki.ca_file,
            "KVPOLICY_ETCD_CERT": self.pki.client_cert,
            "KVPOLICY_ETCD_KEY": self.pki.client_key,
            "KVPOLICY_ETCD_USER": security.user or "",
            "KVPOLICY_ETCD_PASSWORD_FILE": self.password_file if side is None else self.password_files[side],
        }

    def healthy(self, timeout_s: float = 1.0) -> bool:
        """Whether the server answers its health check (over TLS with the client certificate when
        secure; from inside the namespace when it runs in one)."""
        pki = self.pki
        if self.netns is None:
            try:
                return _health(self.host, self.client_port, pki, timeout_s)
            except (OSError, ValueError):
                return False
        tls = [pki.ca_file, pki.client_cert, pki.client_key] if pki else []
        code = (
            f"import sys;sys.path.insert(0,{_ROOT!r});from tests.testbed.etcd import EtcdPKI,_health;a=sys.argv[1:]\n"
            "print(_health(a[0],int(a[1]),EtcdPKI(a[3],'','',a[4],a[5]) if len(a)>3 else None,float(a[2])))"
        )
        command = ["ip", "netns", "exec", self.netns, sys.executable, "-c", code, self.host, str(self.client_port), str(timeout_s), *tls]
        try:
            return _run(command, timeout=timeout_s + 5, check=False).stdout.strip() == "True"
        except subprocess.TimeoutExpired:
            return False

    def stop(self, timeout_s: float = 10.0) -> None:
        """Stop the server (SIGTERM, then SIGKILL); its data dir stays for :meth:`start`."""
        process, self.process = self.process, None
        if process is None or process.poll() is not None:
            return
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout_s)

    def close(self) -> None:
        """Stop the server and delete its data."""
        self.stop()
        self._log.close()
        shutil.rmtree(self.data_dir, ignore_errors=True)

    def __enter__(self) -> EtcdServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _health(host: str, port: int, pki: EtcdPKI | None, timeout_s: float) -> bool:
    """GET /health once (TLS with ``pki``'s CA and client certificate when given)."""
    if pki is None:
        conn: http.client.HTTPConnection = http.client.HTTPConnection(host, port, timeout=timeout_s)
    else:
        context = ssl.create_default_context(cafile=pki.ca_file)
        context.load_cert_chain(pki.client_cert, pki.client_key)
        conn = http.client.HTTPSConnection(host, port, timeout=timeout_s, context=context)
    try:
        conn.request("GET", "/health")
        return json.loads(conn.getresponse().read(4096)).get("health") == "true"
    except (OSError, ValueError, http.client.HTTPException):
        return False
    finally:
        conn.close()


def _user_steps(
    user: str, password: str, prefix: str, permission: str, *, role: str | None = None, exact: bool = False
) -> list[tuple[str, dict]]:
    """Gateway calls that make ``user`` with a role (``role``, default ``<user>-role``) that may
    ``permission`` the keys under ``prefix`` (``exact``: the one key ``prefix``), as ``etcdctl role
    grant-permission ROLE PERMISSION [--prefix=true] KEY`` does."""
    raw = prefix.encode()
    role = role or f"{user}-role"
    perm = {"permType": permission, "key": b64(raw)}
    if not exact:
        perm["range_end"] = b64(prefix_end(raw))
    return [
        ("/v3/auth/user/add", {"name": user, "password": password}),
        ("/v3/auth/role/add", {"name": role}),
        ("/v3/auth/role/grant", {"name": role, "perm": perm}),
        ("/v3/auth/user/grant", {"user": user, "role": role}),
    ]


def _apply(payload: dict) -> None:
    """Make the gateway calls of ``payload`` (see :meth:`EtcdServer._admin`), as root or, before auth
    is enabled, with the client certificate alone."""
    password = payload["root_password"]
    security = EtcdSecurity(*payload["tls"], user="root" if password else None, password=password)
    admin = EtcdClient(payload["endpoint"], security=security, timeout_s=5.0)
    for path, body in payload["steps"]:
        admin.call(path, body)
