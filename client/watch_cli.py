"""`lwf-client watch LINK --out watched.mp4`: watch a world someone shares and write what came.

    lwf-client watch 'http://HOST:8000/w/WORLD#token=TOKEN' --out watched.mp4   (the page's Share link)
    lwf-client watch ws://HOST:8000/v1/realtime/world/watch?world=WORLD --token TOKEN
    lwf-client watch WORLD --token TOKEN [--url ws://HOST:8000]                 (a `shared` answer's fields)

It watches until the world ends (`ended`: unshared, reset, the owner gone), `--chunks N` came,
or Ctrl-C, and writes the chunks received as one MP4 that plays from 0 without a gap
(media/retime.py: a late join, a skipped chunk or the owner's Undo). Every reply is checked
(client/reply_guard.py `WatchGuard`); a refused reply ends it and nothing is written.

Exit codes: 0 the world ended or --chunks came, 1 refused (`unauthorized`, `busy`), a refused
reply, the connection lost (what came is written), 2 a bad link or local path, 130 Ctrl-C
(what came is written).
"""
from __future__ import annotations

import argparse
import asyncio
import os
import sys
from pathlib import Path
from typing import Optional

from websockets.exceptions import ConnectionClosed, InvalidHandshake

from client.errors import BadReply, ReplyTimeout, ServerError, one_line
from client.local_paths import LocalPathError, check_output, write_or_keep
from client.session import DEFAULT_REPLY_TIMEOUT_S, default_url
from client.watching import Watcher, watch_target
from media.retime import Retimer
from protocol.messages import FrameReply

EXIT_ERROR, EXIT_USAGE, EXIT_INTERRUPTED = 1, 2, 130


def add_parser(sub, api_key_env: str, seconds) -> None:
    """`watch` on `lwf-client`'s subparsers (`seconds`: cli_args.py's type for --timeout)."""
    p = sub.add_parser("watch", help="watch a world someone shares (its Share link) and write it as an MP4")
    p.add_argument("link", metavar="LINK",
                   help="the share link (http://HOST/w/WORLD#token=TOKEN), a watch URL (...?world=WORLD) "
                        "or a world id, with --token when the link has none")
    p.add_argument("--token", default=None, help="the watch token (when LINK carries none)")
    p.add_argument("--url", default=None,
                   help=f"the server, for a world id or a watch path without one (default: $LWF_URL, else "
                        f"{default_url()})")
    p.add_argument("--api-key", default=os.environ.get(api_key_env),
                   help=f"API key when the server requires one (default: ${api_key_env})")
    p.add_argument("--out", type=Path, default=Path("watched.mp4"), help="MP4 to write (default watched.mp4)")
    p.add_argument("--chunks", type=int, default=None, metavar="N", help="stop after N chunks (default: until the end)")
    p.add_argument("--timeout", type=seconds, default=DEFAULT_REPLY_TIMEOUT_S, metavar="S",
                   help=f"the longest the world may send nothing (a paused world sends nothing; default "
                        f"{DEFAULT_REPLY_TIMEOUT_S:g})")


class _Watched:
    """What one run received: the chunks, retimed back to back, and what to say about them."""

    def __init__(self) -> None:
        self.parts: list[bytes] = []
        self.joined = False  # `watching` came (else nothing is said about chunks)
        self.frames = 0
        self.first: Optional[int] = None
        self.skipped = 0
        self._last: Optional[int] = None
        self._retime = Retimer()

    def add(self, reply: FrameReply) -> None:
        self.parts.append(self._retime(bytes(reply.video)))
        self.frames += reply.num_frames
        if self._last is not None and reply.chunk_id > self._last + 1:
            self.skipped += reply.chunk_id - self._last - 1
        self.first = reply.chunk_id if self.first is None else self.first
        self._last = reply.chunk_id

    def write(self, out: Path, world_id: str) -> None:
        if not self.parts:
            if self.joined:
                print("no chunk came: nothing written", file=sys.stderr)
            return
        write_or_keep(b"".join(self.parts), out, world_id)
        skipped = f"; {self.skipped} chunks skipped (this viewer read too slowly)" if self.skipped else ""
        print(f"wrote {out} ({len(self.parts)} chunks, {self.frames} frames at 16 fps, from the world's chunk "
              f"{self.first}{skipped})")


async def _watch(args: argparse.Namespace, watched: _Watched) -> str:
    target = watch_target(args.link, args.token, args.url)
    watcher = await Watcher.open(target, args.api_key, idle_timeout_s=args.timeout)
    w = watcher.watching
    watched.joined = True
    print(f"watching world {w.world_id} ({w.viewers} watching; controls: {w.controls})", file=sys.stderr)
    try:
        async for item in watcher:
            if isinstance(item, FrameReply):
                watched.add(item)
                if args.chunks is not None and len(watched.parts) >= args.chunks:
                    return f"{args.chunks} chunks came"
            elif item.event == "ended":
                return f"the world ended: {one_line(item.reason or 'no reason given')}"
            elif item.event == "owner_reconnecting":
                print("the owner's connection dropped: waiting for them to come back", file=sys.stderr)
            elif item.event == "owner_back":
                print("the owner is back", file=sys.stderr)
        return "the server closed the socket"
    finally:
        await watcher.close()


def run(args: argparse.Namespace) -> int:
    """`lwf-client watch`; the exit code (module doc)."""
    if args.chunks is not None and args.chunks < 1:
        print("error: --chunks must be at least 1", file=sys.stderr)
        return EXIT_USAGE
    try:
        check_output(args.out, "--out")
        watch_target(args.link, args.token, args.url)  # a bad link before connecting
    except (LocalPathError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_USAGE
    watched = _Watched()
    code = 0
    try:
        print(asyncio.run(_watch(args, watched)), file=sys.stderr)
    except KeyboardInterrupt:
        print("interrupted: stopped watching", file=sys.stderr)
        code = EXIT_INTERRUPTED
    except BadReply as e:  # nothing of it is kept
        print(f"error: refused the server's reply: {one_line(e.message)}", file=sys.stderr)
        return EXIT_ERROR
    except ServerError as e:
        print(f"server error ({e.code.value}): {one_line(e.message)}", file=sys.stderr)
        code = EXIT_ERROR
    except ReplyTimeout as e:
        print(f"error: {e.message} (--timeout S sets it)", file=sys.stderr)
        code = EXIT_ERROR
    except ConnectionClosed as e:
        rcvd = e.rcvd
        print(f"error: the connection closed ({f'code {rcvd.code}' if rcvd else 'no close frame'})", file=sys.stderr)
        code = EXIT_ERROR
    except (OSError, InvalidHandshake) as e:
        print(f"error: cannot reach the server: {e}", file=sys.stderr)
        return EXIT_ERROR
    try:
        watched.write(args.out, watched_name(args))
    except LocalPathError as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_USAGE
    return code


def watched_name(args: argparse.Namespace) -> str:
    return f"watched-{watch_target(args.link, args.token, args.url).world_id}"
