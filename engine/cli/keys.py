"""``kvpolicy keys``: CURVE key material for the transfer layer's control plane.

``kvpolicy keys new DIR --name NAME --role ROLE`` writes ``DIR/NAME.key`` (public: copy it into the
allow-list directory of every rank of the other role) and ``DIR/NAME.key_secret`` (secret, mode
0600 from the start: it never leaves this host). ROLE is ``prefill`` (a sender), ``decode`` (a
receiver) or ``any`` (no role: both; for single-process tests and tools); a sender accepts only
``decode`` keys, a receiver connects only to ``prefill`` keys (see :mod:`kvpolicy.transports.keys`).
``kvpolicy keys show FILE`` prints a key file's name, public key, fingerprint and role. pyzmq is
imported only when one of these runs, so ``resolve`` and ``lint`` never pay for it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from .common import fail

__all__ = ["register"]


def register(sub: Any) -> None:
    """Add ``keys new`` and ``keys show``."""
    parser = sub.add_parser(
        "keys",
        help="make or inspect the CURVE keys of the transfer layer's control plane",
        description="Make or inspect the CURVE keys that authenticate and encrypt the transfer control plane.",
    )
    actions = parser.add_subparsers(dest="action", metavar="ACTION")
    actions.required = True
    new = actions.add_parser("new", help="write NAME.key and NAME.key_secret into DIR")
    new.add_argument("directory", metavar="DIR")
    new.add_argument("--name", required=True, help="the key's name: what peers and offers (send(to=NAME)) call this rank")
    new.add_argument(
        "--role",
        required=True,
        choices=("prefill", "decode", "any"),
        help="prefill: a sender (only decode keys may ask it for blocks); decode: a receiver (it connects only to "
        "prefill keys); any: no role, both (for single-process tests and tools)",
    )
    new.add_argument("--force", action="store_true", help="replace an existing key of that name")
    new.add_argument("--format", choices=("text", "json"), default="text")
    new.set_defaults(run=run_new)
    show = actions.add_parser("show", help="print a key file's name, public key, fingerprint and role")
    show.add_argument("file", metavar="FILE")
    show.add_argument("--format", choices=("text", "json"), default="text")
    show.set_defaults(run=run_show)


def _describe(path: Path, args: Any) -> int:
    from kvpolicy.transports.keys import AllowList, KeyMaterialError
    from kvpolicy.transports.addresses import fingerprint

    try:
        [peer] = AllowList([path]).entries()
    except KeyMaterialError as exc:
        return fail(str(exc))
    info = {
        "name": peer.name,
        "public_key": peer.public.decode(),
        "fingerprint": fingerprint(peer.public),
        "role": peer.role or "any",
        "file": str(path),
    }
    if args.format == "json":
        print(json.dumps(info, indent=2))
    else:
        print(f"{info['name']}  {info['public_key']}  fingerprint {info['fingerprint']}  role {info['role']}  ({info['file']})")
    return 0


_NEXT_STEP = {
    "prefill": "copy {public} into the allowed_peers directory of every decode rank",
    "decode": "copy {public} into the allowed_peers directory of every prefill rank",
    "any": "copy {public} into the allowed_peers directory of every peer (a key without a role is allowed as sender "
    "and receiver: meant for single-process tests and tools; use --role prefill or decode for a deployment)",
}


def run_new(args: Any) -> int:
    """Write a new key pair; refuses to overwrite one unless ``--force``."""
    from kvpolicy.transports.keys import KeyMaterialError, create_keys

    folder = Path(args.directory)
    try:
        public, secret = create_keys(folder, args.name, None if args.role == "any" else args.role, overwrite=args.force)
    except KeyMaterialError as exc:  # names the file and the fix
        return fail(str(exc))
    except OSError as exc:
        return fail(f"{exc.filename or folder}: cannot write the key pair ({exc.strerror or exc})")
    code = _describe(public, args)
    if args.format == "text":
        print(f"secret key: {secret} (mode 0600: keep it on this host)\npublic key: {public}")
        print("next: " + _NEXT_STEP[args.role].format(public=public.name))
    return code


def run_show(args: Any) -> int:
    """Print one key file's name, public key, fingerprint and role."""
    path = Path(args.file)
    if not path.is_file():
        return fail(f"{path}: no such key file; make one with `kvpolicy keys new DIR --name NAME --role ROLE`")
    return _describe(path, args)
