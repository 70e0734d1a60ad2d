"""`lwf-client`'s command line: the parser and the argument types (client/cli.py runs them)."""
from __future__ import annotations

import argparse
import os
from pathlib import Path

from camera.frames import CHUNK_VIDEO_FRAMES, FIRST_CHUNK_VIDEO_FRAMES
from client.keyscript import chunk_keys, parse_keyscript
from client.session import DEFAULT_QUEUE_TIMEOUT_S, DEFAULT_REPLY_TIMEOUT_S, DEFAULT_URL, URL_ENV, default_url
from client.watch_cli import add_parser as add_watch_parser
from client.worlds.session import add_parsers as add_world_session_parsers
from client.worlds.commands import add_parsers as add_world_parsers

API_KEY_ENV = "LWF_API_KEY"
EXAMPLES = f"""examples (a server from `serve run serve_config.yaml` on this machine; elsewhere
`export {URL_ENV}=ws://HOST:8000` once, or --url ws://HOST:8000 on each command):
  lwf-client orbit --out orbit.mp4                          a synthetic orbit, 81 frames
  lwf-client orbit --frames 33 --out o.mp4
  lwf-client drive w:3,j+w:2,none:1 --out walk.mp4           keys held per chunk
  lwf-client orbit --fork-at 3 --branch-keys l:4 --out o.mp4  o.mp4 and o.branch.mp4
  lwf-client play ../shared/examples/00 --frames 33 --out ex.mp4
  lwf-client compare o.mp4 o.branch.mp4 -o side_by_side.mp4
  lwf-client watch 'http://HOST:8000/w/WORLD#token=TOKEN' --out watched.mp4   a shared world
  lwf-client drive w:3 --save "a walk"                      saved on the server: prints the world id
  lwf-client open WORLD_ID --keys d:2 --out more.mp4         continue a saved world (reopen: run it again)

exit status: 0 done, 1 server or connection error, 2 bad input or local path, 130 interrupted"""


def prompt_at(value: str) -> tuple[int, str]:
    """`CHUNK:TEXT` -> (chunk, text), for --prompt-at."""
    chunk, sep, text = value.partition(":")
    if not sep or not chunk.strip().isdigit() or int(chunk) < 1 or not text:
        raise argparse.ArgumentTypeError(f"expected CHUNK:TEXT with CHUNK >= 1, got {value!r}")
    return int(chunk), text


def keyscript(value: str) -> list[tuple[str, ...]]:
    """`w:3,j+w:2,none:1` -> the keys held per chunk, for `drive` and --branch-keys."""
    try:
        return chunk_keys(parse_keyscript(value))
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def seconds(value: str) -> float:
    """A positive number of seconds, for --timeout and --queue-timeout."""
    try:
        s = float(value)
    except ValueError:
        s = float("nan")
    if not 0 < s < float("inf"):
        raise argparse.ArgumentTypeError(f"expected a number of seconds > 0, got {value!r}")
    return s


def chunk_index(value: str) -> int:
    if not value.strip().isdigit():
        raise argparse.ArgumentTypeError(f"expected a chunk index >= 0, got {value!r}")
    return int(value)


def _connection(p: argparse.ArgumentParser) -> None:
    """The options of every command that opens a session: the server, its timeouts, the MP4, the save."""
    p.add_argument("--url", default=default_url(),
                   help=f"server WebSocket (or http) address (default: ${URL_ENV}, else {DEFAULT_URL})")
    p.add_argument("--timeout", type=seconds, default=DEFAULT_REPLY_TIMEOUT_S, metavar="S",
                   help=f"the longest the server may go without answering (default {DEFAULT_REPLY_TIMEOUT_S:g})")
    p.add_argument("--queue-timeout", type=seconds, default=DEFAULT_QUEUE_TIMEOUT_S, metavar="S",
                   help="the longest the session may wait in the server's line for a place (`queued`; "
                        f"default {DEFAULT_QUEUE_TIMEOUT_S:g})")
    p.add_argument("--out", type=Path, default=Path("video.mp4"), help="MP4 to write (default video.mp4)")
    p.add_argument("--api-key", default=os.environ.get(API_KEY_ENV),
                   help=f"API key when the server requires one (default: ${API_KEY_ENV})")
    p.add_argument("--session-id", default=None, help="session id (default: random)")
    p.add_argument("--save", default=None, metavar="TITLE",
                   help="at the end, save the session as a world titled TITLE on a server that keeps worlds "
                        "(`worlds.enabled`) and print its id: `lwf-client open WORLD_ID` continues it. The "
                        "session declares no length (open-ended: per-chunk noise), so that it can go on past it")


def _base() -> argparse.ArgumentParser:
    """Options of every streaming command (play, orbit, dolly, pan, drive)."""
    base = argparse.ArgumentParser(add_help=False)
    _connection(base)
    base.add_argument("--seed", type=int, default=None, help="noise seed (server default 42)")
    base.add_argument("--size", default=None,
                      help='max output area "H*W" (default: the server\'s, stated in its handshake: "128*224" for '
                           'serve_config.yaml on a CPU, which accepts up to 256*448; "480*832" on a GPU)')
    base.add_argument("--pipeline", type=int, default=2, metavar="N", help="requests kept in flight (default 2)")
    base.add_argument("--no-resume", action="store_true",
                      help="end on a dropped connection (default: reconnect and resume the session "
                           "when the server allows it, handshake `resume_grace_s`)")
    base.add_argument("--prompt", default=None, help="text prompt (overrides prompt.txt)")
    base.add_argument("--save-session", type=Path, default=None, metavar="DIR",
                      help="keep what was sent and received: inputs, every reply's fMP4 payload and fields, "
                           "each branch's MP4 (client/recorder.py)")
    branch = base.add_argument_group("exploration (after the main session, on the same connection)")
    where = branch.add_mutually_exclusive_group()
    where.add_argument("--fork-at", type=chunk_index, default=None, metavar="K",
                       help="fork a second session from the main one's first K chunks (K >= 1)")
    where.add_argument("--rewind-to", type=chunk_index, default=None, metavar="K",
                       help="take the main session back to chunk K and produce K, K+1, ... again")
    branch.add_argument("--branch-trajectory", nargs="+", type=Path, default=None, metavar="EXAMPLE_DIR_or_FILES",
                        help="the branch's poses from chunk K on come from this trajectory")
    branch.add_argument("--branch-keys", type=keyscript, default=None, metavar="SCRIPT",
                        help="the branch is driven by keys from chunk K on (a key script, as `drive`)")
    branch.add_argument("--branch-prompt", default=None, metavar="TEXT",
                        help="the branch steers to TEXT from chunk K on (prompt_update)")
    branch.add_argument("--branch-out", type=Path, default=None,
                        help="the branch's MP4 (default: OUT with .branch before the suffix)")
    return base


def parser() -> argparse.ArgumentParser:
    base = _base()
    planned = argparse.ArgumentParser(add_help=False, parents=[base])
    planned.add_argument("--frames", type=int, default=81,
                         help=f"video frames to generate: {FIRST_CHUNK_VIDEO_FRAMES} + {CHUNK_VIDEO_FRAMES}k (9, 21, "
                              "33, ... 81; other values are rounded down, and said so) (default 81)")
    planned.add_argument("--prompt-at", action="append", default=[], type=prompt_at, metavar="CHUNK:TEXT",
                         help="prompt steering: from chunk CHUNK (>= 1) on the session follows TEXT, keeping "
                              "its scene (repeatable)")

    p = argparse.ArgumentParser(prog="lwf-client", description="`lwf-client`: stream a camera trajectory through "
                                                              "the server and write the MP4.",
                                epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)
    play = sub.add_parser("play", parents=[planned], help="play an example folder (image, prompt, poses, intrinsics)")
    play.add_argument("inputs", nargs="+", type=Path, metavar="EXAMPLE_DIR_or_FILES")
    image = argparse.ArgumentParser(add_help=False)
    image.add_argument("--image", type=Path, default=None, help="start image, PNG or JPEG (default: generated)")
    synth = argparse.ArgumentParser(add_help=False, parents=[planned, image])
    synth.add_argument("--save-trajectory", type=Path, default=None, metavar="DIR",
                       help="also write what was sent (poses.npy, intrinsics.npy, prompt.txt, image)")
    orbit = sub.add_parser("orbit", parents=[synth], help="circle a point ahead of the camera")
    orbit.add_argument("--degrees", type=float, default=60.0, help="arc swept around the point (default 60)")
    orbit.add_argument("--radius", type=float, default=4.0, help="distance to the point, scene units (default 4)")
    dolly = sub.add_parser("dolly", parents=[synth], help="move straight ahead (negative: back)")
    dolly.add_argument("--distance", type=float, default=2.0, help="scene units travelled (default 2)")
    pan = sub.add_parser("pan", parents=[synth], help="turn in place (negative: left)")
    pan.add_argument("--degrees", type=float, default=45.0, help="angle turned (default 45)")
    drive = sub.add_parser("drive", parents=[base, image],
                           help="drive with keys: a script KEYS:CHUNKS,... (e.g. w:3,j:2,none:1; KEYS joined by "
                                "+, `none` for no key), sent as `control` + `from_keys` infers")
    drive.add_argument("script", type=keyscript, metavar="SCRIPT",
                       help="keys held per chunk: KEYS:CHUNKS entries joined by commas, KEYS joined by + "
                            "(w a s d move, q e up/down, i j k l or arrows look, none for no key), e.g. w:3,j+w:2,none:1")
    add_world_parsers(sub, API_KEY_ENV)  # worlds, export, import, delete (client/worlds/commands.py)
    add_watch_parser(sub, API_KEY_ENV, seconds)  # watch a shared world (client/watch_cli.py)
    session = argparse.ArgumentParser(add_help=False)
    _connection(session)
    add_world_session_parsers(sub, session, keyscript)  # open, reopen (client/worlds/session.py)
    compare = sub.add_parser("compare", help="play videos side by side (e.g. a session and its branches)")
    compare.add_argument("videos", nargs="+", type=Path, metavar="VIDEO",
                         help="MP4 files to put side by side, left to right (e.g. OUT.mp4 OUT.branch.mp4)")
    compare.add_argument("-o", "--out", type=Path, default=Path("side_by_side.mp4"),
                         help="MP4 to write (default side_by_side.mp4; needs the `video` extra), or an .html "
                              "page that plays them side by side in a browser (the core install)")
    compare.add_argument("--labels", type=lambda v: v.split(","), default=None, metavar="A,B,...",
                         help="the names drawn above the videos, comma-separated (default: their file names)")
    return p
