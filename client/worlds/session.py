"""`lwf-client open / reopen WORLD_ID`: continue a saved world (PROTOCOL.md, save / open / reopen).

    lwf-client open WORLD_ID --keys w:3,none:1 [--out more.mp4] [--save TITLE]
    lwf-client open WORLD_ID --trajectory EXAMPLE_DIR [--frames 57]
    lwf-client reopen WORLD_ID [--keys ... | --trajectory ...] [--out again.mp4]

`open` makes the world session SESSION_ID of a new connection (`open`: rebuilt from the store,
byte-identical to the session that made it) and continues it: chunk after chunk with keys held
(a key script, as `drive`), or with the cameras of a trajectory's chunks 1, 2, ... (its poses
as the trajectory has them: a trajectory that starts where the world ended continues it
smoothly). The MP4 written is the continuation: the world's init segment, then the new chunks.

`reopen` is for a world `open` refuses as `world_changed` (the server's model setup changed
since it was made): the world's inputs (image, prompts by chunk, cameras by chunk) run again
through the served model from its first chunk as a new session: new chunks, not the stored
ones' bytes where the setup changed. The MP4 holds them, then the continuation if asked.

`--save TITLE` saves the session at the end as a new world (the id is printed), as on the
streaming commands. Exit codes as `lwf-client`'s.
"""
from __future__ import annotations

import argparse
import time
import uuid
from pathlib import Path

from client.errors import ServerError
from client.keydrive import drive_keys
from client.local_paths import write_or_keep
from client.session import WorldClient
from client.stats import ChunkStat
from client.streaming import StreamResult
from client.trajectory import Trajectory, plan_session
from protocol.messages import ErrorReply, FrameReply

WORLD_SESSION_COMMANDS = ("open", "reopen")


def add_parsers(sub, common: argparse.ArgumentParser, keyscript) -> None:
    """`open` and `reopen` on `lwf-client`'s subparsers (`common`: --url, --timeout, --out, ...)."""
    for name, what in (("open", "continue a saved world (byte-identical where the server's model setup is "
                                "the world's) with keys or a trajectory, writing the continuation's MP4"),
                       ("reopen", "run a saved world's inputs again through the served model from its first "
                                  "chunk (for a `world_changed` world), then continue it if asked")):
        p = sub.add_parser(name, parents=[common], help=what)
        p.add_argument("world_id", help="its id (from `--save`, `lwf-client worlds` or a `world_changed` error)")
        how = p.add_mutually_exclusive_group(required=name == "open")
        how.add_argument("--keys", type=keyscript, default=None, metavar="SCRIPT",
                         help="the keys held per chunk after the world's last (a key script, as `drive`)")
        how.add_argument("--trajectory", nargs="+", type=Path, default=None, metavar="EXAMPLE_DIR_or_FILES",
                         help="the cameras of this trajectory's chunks 1, 2, ... continue it")
        p.add_argument("--frames", type=int, default=81,
                       help="with --trajectory: the trajectory's plan (its chunks after the first are sent; "
                            "default 81)")


def _cameras(args: argparse.Namespace) -> list[tuple]:
    """(poses, intrinsics) per chunk to continue with, from --trajectory (chunks 1, 2, ...)."""
    if args.trajectory is None:
        return []
    plan = plan_session(Trajectory.load(args.trajectory, prompt=""), args.frames)
    return [(plan.chunk_poses[k], plan.chunk_intrinsics(k)) for k in range(1, plan.num_chunks)]


async def run_world_session(args: argparse.Namespace) -> None:
    """Open (or reopen) the world, continue it, write the MP4, save it when asked. Raises as
    the streaming commands do (ServerError, ReplyTimeout, BadReply, OSError, ...)."""
    cameras = _cameras(args)  # read before connecting (ValueError, OSError: bad input)
    sid = args.session_id or f"lwf-client-{uuid.uuid4().hex[:8]}"
    client = await WorldClient.connect(args.url, api_key=args.api_key, reply_timeout_s=args.timeout,
                                       queue_timeout_s=args.queue_timeout)
    result = StreamResult(started_at=time.perf_counter())
    try:
        if args.command == "open":
            opened = await client.open(args.world_id, sid)
            if opened.init_segment is None:
                raise ValueError("the server sent no init segment for this world (its chunk 0 kept no video)")
            result.video.append(opened.init_segment)
            next_chunk = opened.next_chunk_id
            print(f"opened {args.world_id} as session {sid}: {next_chunk} chunks, continuing from chunk {next_chunk}")
        else:
            reopened = await client.reopen(args.world_id, sid)
            changed = ", ".join(reopened.changed) or "none: the same model setup"
            print(f"reopened {args.world_id} as session {sid}: its {reopened.chunks} chunks run again through the "
                  f"served model (changed: {changed}); new chunks, not the stored ones")
            while len(result.video) < reopened.chunks:  # its frame replies follow `reopened`
                reply = await client.receive()
                if isinstance(reply, ErrorReply):
                    raise ServerError.from_reply(reply)
                if isinstance(reply, FrameReply):
                    result.video.append(bytes(reply.video))
            next_chunk = reopened.chunks
        if args.keys is not None:
            await drive_keys(client, sid, args.keys, into=result, first_chunk=next_chunk)
        for k, (poses, intrinsics) in enumerate(cameras):
            t0 = time.perf_counter()
            reply = await client.infer(sid, poses, intrinsics)
            result.video.append(bytes(reply.video))
            result.stats.append(ChunkStat(k, reply.num_frames, t0, time.perf_counter(), dict(reply.stage_durations),
                                          bool(reply.cached)))
        write_or_keep(result.video.data, args.out, sid)
        made = len(result.video) - (1 if args.command == "open" else 0)
        print(f"wrote {args.out} ({made} chunks{' after the init segment' if args.command == 'open' else ''}, "
              f"session {sid})")
        if args.save is not None:
            await save_and_say(client, sid, args.save)
        await client.reset(sid)
    finally:
        await client.close()


async def save_and_say(client: WorldClient, session_id: str, title: str) -> str:
    """`save` the session as a world titled `title`; print its id and how to open it."""
    saved = await client.save(session_id, title)
    print(f"saved session {session_id} as world {saved.world_id} ({saved.chunks} chunks): "
          f"lwf-client open {saved.world_id} --keys w:2")
    return saved.world_id


def world_changed_hint(world_id: str) -> str:
    return (f"the server's model setup changed since this world was made: `lwf-client reopen {world_id}` runs its "
            "inputs again through the served model from its first chunk (new chunks)")
