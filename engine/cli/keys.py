"""``kvpolicy keys``: CURVE key material for the transfer layer's control plane.

``kvpolicy keys new DIR --name NAME`` writes ``DIR/NAME.key`` (public: copy it to every peer's
allow-list directory) and ``DIR/NAME.key_secret`` (secret, mode 0600: it never leaves this host).
``kvpolicy keys show FILE`` prints a key file's name, public key and fingerprint. pyzmq is imported
only when one of these runs, so ``resolve`` and ``lint`` never pay for it.
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
    new.add_argument("--force", action="store_true", help="replace an existing key of that name")
    new.add_argument("--format", choices=("text", "json"), default="text")
    new.set_defaults(run=run_new)
    show = actions.add_parser("show", help="print a key file's name, public key and fingerprint")
    show.add_argument("file", metavar="FILE")
    show.add_argument("--format", choices=("text", "json"), default="text")
    show.set_defaults(run=run_show)


def _describe(path: Path, args: Any) -> int:
    from kvpolicy.transports.keys import AllowList, KeyMaterialError, fingerprint

    try:
        allowed = AllowList([path])
    except KeyMaterialError as exc:
        return fail(str(exc))
    [(public, name)] = allowed._keys.items()
    info = {"name": name, "public_key": public.decode(), "fingerprint": fingerprint(public), "file": str(path)}
    if args.format == "json":
        print(json.dumps(info, indent=2))
    else:
        print(f"{info['name']}  {info['public_key']}  fingerprint {info['fingerprint']}  ({info['file']})")
    return 0


def run_new(args: Any) -> int:
    """Write a new key pair; refuses to overwrite one unless ``--force``."""
    from kvpolicy.transports.keys import KeyMaterialError, create_keys

    folder = Path(args.directory)
    existing = [p for p in (folder / f"{args.name}.key", folder / f"{args.name}.key_secret") if p.exists()]
    if existing and not args.force:
        return fail(f"{existing[0]}: a key named {args.name!r} exists already; pass --force to replace it")
    try:
        public, secret = create_keys(folder, args.name)
    except (KeyMaterialError, OSError) as exc:
        return fail(f"{folder}: {exc}")
    code = _describe(public, args)
    if args.format == "text":
        print(f"secret key: {secret} (keep it on this host)\npublic key: {public} (copy it into each peer's allowed_peers directory)")
    return code


def run_show(args: Any) -> int:
    """Print one key file's name, public key and fingerprint."""
    path = Path(args.file)
    if not path.is_file():
        return fail(f"{path}: no such key file; make one with `kvpolicy keys new DIR --name NAME`")
    return _describe(path, args)
