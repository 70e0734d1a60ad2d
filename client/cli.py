"""`lwf-client`: stream a camera trajectory through the server and write the MP4.

    lwf-client play EXAMPLE_DIR_or_FILES --url ws://HOST:8000 [--frames 81] [--out video.mp4]
    lwf-client orbit|dolly|pan [--image IMG] [--prompt TEXT] [--save-trajectory DIR] ...

Exit codes: 0 done, 1 server or connection error, 2 bad input, 130 interrupted (Ctrl-C:
the session is reset and the socket closed). When the stream fails after some chunks came
(e.g. the socket dropped and the resume failed), the MP4 of those chunks is written anyway
and what happened is printed, then the exit code is 1.
"""
from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Optional

from tqdm import tqdm
from websockets.exceptions import ConnectionClosed, InvalidHandshake

from camera.frames import CHUNK_VIDEO_FRAMES, FIRST_CHUNK_VIDEO_FRAMES
from client.errors import ServerError
from client.session import DEFAULT_URL, WorldClient
from client.stats import ChunkStat
from client.streaming import ResumePolicy, StreamResult
from client.synthetic import DEFAULT_PROMPT, synthetic_trajectory
from client.trajectory import Trajectory, plan_session
from protocol.errors import ErrorCode, ProtocolError
from protocol.messages import FrameReply

API_KEY_ENV = "LWF_API_KEY"
EXIT_ERROR, EXIT_USAGE, EXIT_INTERRUPTED = 1, 2, 130


def _parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--url", default=DEFAULT_URL,
                        help=f"server WebSocket (or http) address (default {DEFAULT_URL})")
    common.add_argument("--frames", type=int, default=81,
                        help=f"video frames to generate: {FIRST_CHUNK_VIDEO_FRAMES} + {CHUNK_VIDEO_FRAMES}k (9, 21, "
                             "33, ... 81; other values are rounded down, and said so) (default 81)")
    common.add_argument("--seed", type=int, default=None, help="noise seed (server default 42)")
    common.add_argument("--size", default=None, help='max output area "H*W" (server default, e.g. "480*832")')
    common.add_argument("--out", type=Path, default=Path("video.mp4"), help="MP4 to write (default video.mp4)")
    common.add_argument("--api-key", default=os.environ.get(API_KEY_ENV),
                        help=f"API key when the server requires one (default: ${API_KEY_ENV})")
    common.add_argument("--pipeline", type=int, default=2, metavar="N", help="requests kept in flight (default 2)")
    common.add_argument("--session-id", default=None, help="session id (default: random)")
    common.add_argument("--no-resume", action="store_true",
                        help="end on a dropped connection (default: reconnect and resume the session "
                             "when the server allows it, handshake `resume_grace_s`)")
    common.add_argument("--prompt", default=None, help="text prompt (overrides prompt.txt)")
    common.add_argument("--prompt-at", action="append", default=[], type=prompt_at, metavar="CHUNK:TEXT",
                        help="prompt steering: from chunk CHUNK (>= 1) on the session follows TEXT, keeping "
                             "its scene (repeatable)")

    p = argparse.ArgumentParser(prog="lwf-client", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    play = sub.add_parser("play", parents=[common], help="play an example folder (image, prompt, poses, intrinsics)")
    play.add_argument("inputs", nargs="+", type=Path, metavar="EXAMPLE_DIR_or_FILES")
    synth = argparse.ArgumentParser(add_help=False, parents=[common])
    synth.add_argument("--image", type=Path, default=None, help="start image, PNG or JPEG (default: generated)")
    synth.add_argument("--save-trajectory", type=Path, default=None, metavar="DIR",
                       help="also write what was sent (poses.npy, intrinsics.npy, prompt.txt, image)")
    orbit = sub.add_parser("orbit", parents=[synth], help="circle a point ahead of the camera")
    orbit.add_argument("--degrees", type=float, default=60.0, help="arc swept around the point (default 60)")
    orbit.add_argument("--radius", type=float, default=4.0, help="distance to the point, scene units (default 4)")
    dolly = sub.add_parser("dolly", parents=[synth], help="move straight ahead (negative: back)")
    dolly.add_argument("--distance", type=float, default=2.0, help="scene units travelled (default 2)")
    pan = sub.add_parser("pan", parents=[synth], help="turn in place (negative: left)")
    pan.add_argument("--degrees", type=float, default=45.0, help="angle turned (default 45)")
    return p


def prompt_at(value: str) -> tuple[int, str]:
    """`CHUNK:TEXT` -> (chunk, text), for --prompt-at."""
    chunk, sep, text = value.partition(":")
    if not sep or not chunk.strip().isdigit() or int(chunk) < 1 or not text:
        raise argparse.ArgumentTypeError(f"expected CHUNK:TEXT with CHUNK >= 1, got {value!r}")
    return int(chunk), text


def frames_notice(requested: int, planned: int, poses: int) -> Optional[str]:
    """What `--frames` was rounded to and why, or None when it is made as asked."""
    if planned == requested:
        return None
    why = f"videos are {FIRST_CHUNK_VIDEO_FRAMES} frames for the first chunk, then {CHUNK_VIDEO_FRAMES} per chunk"
    if poses < requested:
        why = f"the trajectory has {poses} poses; {why}"
    return f"--frames {requested} rounded down to {planned}: {why}"


def trajectory_from_args(args: argparse.Namespace) -> Trajectory:
    """The trajectory a command plays (loaded, or synthesised and optionally saved)."""
    if args.command == "play":
        return Trajectory.load(args.inputs, prompt=args.prompt)
    shape = {k: getattr(args, k) for k in ("degrees", "radius", "distance") if hasattr(args, k)}
    image = args.image.read_bytes() if args.image is not None else None
    traj = synthetic_trajectory(args.command, args.frames, image=image,
                                prompt=args.prompt if args.prompt is not None else DEFAULT_PROMPT, **shape)
    if args.save_trajectory is not None:
        traj.save(args.save_trajectory)
    return traj


async def play(args: argparse.Namespace, traj: Trajectory) -> None:
    """Stream `traj`, show progress, write the MP4 and print the summary."""
    plan = plan_session(traj, args.frames)
    notice = frames_notice(args.frames, plan.num_frames, len(traj.poses))
    if notice:
        print(notice, file=sys.stderr)
    sid = args.session_id or f"lwf-client-{uuid.uuid4().hex[:8]}"
    messages = traj.messages(plan, sid, seed=args.seed, size=args.size,  # validated before connecting
                             prompt_schedule=dict(getattr(args, "prompt_at", None) or []))
    client = await WorldClient.connect(args.url, api_key=args.api_key)
    bar = tqdm(total=plan.num_chunks, unit="chunk", desc=f"{plan.num_frames} frames", file=sys.stderr)

    def on_chunk(stat: ChunkStat, reply: FrameReply) -> None:
        bar.set_postfix_str(f"chunk {stat.index}: {1000 * stat.latency_s:.0f} ms, {reply.resolution[0]}x"
                            f"{reply.resolution[1]}")
        bar.update(1)

    def on_busy(err: ServerError) -> None:
        bar.write(f"server busy: {err.message} (retrying in {err.retry_after_s:g} s)", file=sys.stderr)

    result = StreamResult(started_at=time.perf_counter())
    grace_s = client.config.resume_grace_s
    try:
        resume = None if args.no_resume or not grace_s else ResumePolicy(sid)
        await client.stream(messages, pipeline=args.pipeline, on_chunk=on_chunk, on_busy=on_busy,
                            resume=resume, into=result)
    except asyncio.CancelledError:  # Ctrl-C: leave the server clean
        await _reset_quietly(client, sid)
        raise
    except (ServerError, ConnectionClosed, OSError) as e:
        _keep_partial(args, result, plan.num_chunks, sid, grace_s, e)
        raise
    finally:
        bar.close()
        await client.close()
    result.video.write(args.out)
    summary = result.summary()
    print(f"wrote {args.out} ({summary.frames} frames at {client.config.fps} fps, session {sid})")
    if result.resumes:
        print(f"the connection dropped {result.resumes} time(s); resumed, {result.replayed} replies sent again")
    print(summary.format())


def _keep_partial(args: argparse.Namespace, result: StreamResult, chunks: int, sid: str,
                  grace_s: Optional[float], error: BaseException) -> None:
    """The stream failed: write the chunks received so far, and say what happened and what can
    be done (the session id and token let any client resume it while the server keeps it)."""
    if not result.stats:
        return
    result.video.write(args.out)
    frames = sum(s.num_frames for s in result.stats)
    print(f"incomplete: wrote {args.out} with the {len(result.stats)} of {chunks} chunks received ({frames} "
          f"frames) before the stream failed", file=sys.stderr)
    refused = isinstance(error, ServerError) and error.code in (ErrorCode.SESSION_LOST, ErrorCode.UNAUTHORIZED)
    if refused or not grace_s or result.resume_token is None:
        print("the server no longer holds the session: run the same command again for the whole video",
              file=sys.stderr)
    else:
        print(f"the server keeps the session for {grace_s:g} s after the drop: resume it with session_id {sid} "
              f"and resume_token {result.resume_token} (a `resume` request, resume_from {len(result.stats)}), "
              "or run the same command again for the whole video", file=sys.stderr)


async def _reset_quietly(client: WorldClient, session_id: str) -> None:
    try:
        await client.reset(session_id)
    except (ServerError, ConnectionClosed, asyncio.TimeoutError, OSError):
        pass  # the server frees the session when the socket closes anyway


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = _parser().parse_args(argv)
    try:
        traj = trajectory_from_args(args)
    except (ValueError, OSError) as e:  # unreadable or inconsistent input files
        print(f"error: {e}", file=sys.stderr)
        return EXIT_USAGE
    try:
        asyncio.run(play(args, traj))
    except KeyboardInterrupt:
        print("interrupted: session reset, connection closed", file=sys.stderr)
        return EXIT_INTERRUPTED
    except ServerError as e:
        print(f"server error ({e.code.value}): {e.message}", file=sys.stderr)
        return EXIT_ERROR
    except ProtocolError as e:  # caught before sending: the server would answer the same code
        print(f"invalid input ({e.code.value}): {e.message}", file=sys.stderr)
        return EXIT_USAGE
    except ConnectionClosed as e:
        rcvd = e.rcvd
        why = f"code {rcvd.code}: {rcvd.reason or 'no reason given'}" if rcvd else "no close frame"
        print(f"error: the server closed the connection ({why})", file=sys.stderr)
        return EXIT_ERROR
    except (OSError, InvalidHandshake) as e:  # includes TimeoutError
        print(f"error: cannot reach the server at {args.url}: {e}", file=sys.stderr)
        return EXIT_ERROR
    except ValueError as e:  # e.g. too few frames for one chunk, a malformed --url
        print(f"error: {e}", file=sys.stderr)
        return EXIT_USAGE
    return 0


if __name__ == "__main__":
    sys.exit(main())
