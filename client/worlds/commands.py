"""`lwf-client worlds / export / import / delete`: your saved worlds on a server that keeps them
(`worlds.enabled`), through its `/v1/worlds` routes (docs/PROTOCOL.md §6), with the standard
library only (the client's core install has no HTTP client of its own).

`--url` is the server's WebSocket URL, as for the other commands (its HTTP base is derived:
ws -> http, wss -> https, the path before /v1/realtime/world/camera kept) or an http(s) base.
Worlds are your API key's (`--api-key`, or LWF_API_KEY), or your address's without auth.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Optional
from urllib.parse import urlsplit, urlunsplit

from client.session import CAMERA_PATH, DEFAULT_URL

WORLD_COMMANDS = ("worlds", "export", "import", "delete")
LWF_TYPE = "application/octet-stream"
TIMEOUT_S = 300.0  # an export or import of a large world


def add_parsers(sub, api_key_env: str) -> None:
    """The world commands on `lwf-client`'s subparsers."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--url", default=DEFAULT_URL, help=f"the server (default {DEFAULT_URL})")
    common.add_argument("--api-key", default=os.environ.get(api_key_env),
                        help=f"API key (default: ${api_key_env}); without auth, worlds are your address's")
    sub.add_parser("worlds", parents=[common], help="list your saved worlds on the server")
    export = sub.add_parser("export", parents=[common], help="download a world as one .lwf file")
    export.add_argument("world_id", help="its id (from `lwf-client worlds`)")
    export.add_argument("-o", "--out", type=Path, default=None, help="file to write (default WORLD_ID.lwf)")
    imported = sub.add_parser("import", parents=[common], help="upload a .lwf file as a new world of yours")
    imported.add_argument("file", type=Path, help="the .lwf file")
    delete = sub.add_parser("delete", parents=[common], help="delete one of your worlds")
    delete.add_argument("world_id")


def http_base(url: str) -> str:
    """The server's HTTP base from its WebSocket URL (or an http(s) URL as it is)."""
    parts = urlsplit(url)
    scheme = {"ws": "http", "wss": "https"}.get(parts.scheme, parts.scheme)
    if scheme not in ("http", "https") or not parts.netloc:
        raise ValueError(f"--url {url!r} is not a ws://, wss://, http:// or https:// URL")
    path = parts.path.rstrip("/")
    if path.endswith(CAMERA_PATH):
        path = path[: -len(CAMERA_PATH)]
    return urlunsplit((scheme, parts.netloc, path, "", ""))


def _call(args: argparse.Namespace, method: str, path: str, body: Optional[bytes] = None) -> bytes:
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    if body is not None:
        headers["Content-Type"] = LWF_TYPE
    request = urllib.request.Request(http_base(args.url) + "/v1/worlds" + path, data=body, method=method,
                                     headers=headers)
    with urllib.request.urlopen(request, timeout=TIMEOUT_S) as response:
        return response.read()


def run(args: argparse.Namespace) -> int:
    """One world command; the exit code (0, 1: the server refused or is unreachable, 2: usage)."""
    try:
        if args.command == "worlds":
            for w in json.loads(_call(args, "GET", ""))["data"]:
                h, wd = w["size"]
                print(f"{w['id']}  {w['chunks']:4d} chunks  {h}x{wd}  {w['bytes'] / 1e6:8.1f} MB  {w['title']}")
        elif args.command == "export":
            out = args.out or Path(f"{args.world_id}.lwf")
            data = _call(args, "GET", f"/{args.world_id}/export")
            out.write_bytes(data)
            print(f"wrote {out} ({len(data)} bytes)")
        elif args.command == "import":
            world = json.loads(_call(args, "POST", "/import", args.file.read_bytes()))
            print(f"imported {args.file} as {world['id']} ({world['chunks']} chunks)")
        else:
            json.loads(_call(args, "DELETE", f"/{args.world_id}"))
            print(f"deleted {args.world_id}")
    except urllib.error.HTTPError as e:
        try:
            body = json.loads(e.read())
            print(f"server error ({body['code']}): {body['message']}", file=sys.stderr)
        except (ValueError, KeyError, TypeError):
            print(f"server error: HTTP {e.code}", file=sys.stderr)
        return 1
    except urllib.error.URLError as e:
        print(f"error: cannot reach the server at {args.url}: {e.reason}", file=sys.stderr)
        return 1
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except OSError as e:  # the local file
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0
