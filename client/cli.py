"""`lwf-client`: stream a camera trajectory through the server and write the MP4.

    lwf-client play EXAMPLE_DIR_or_FILES [--url ws://HOST:8000, default $LWF_URL] [--frames 81] [--out video.mp4]
    lwf-client orbit|dolly|pan [--image IMG] [--prompt TEXT] [--save-trajectory DIR] ...
    lwf-client drive w:3,j:2,none:1 [--image IMG] ...        keys held per chunk (client/keyscript.py)
    lwf-client ... --fork-at K | --rewind-to K [--branch-trajectory ...|--branch-keys ...] [--branch-prompt ...]
    lwf-client ... --save-session DIR                          (client/recorder.py)
    lwf-client compare A.mp4 B.mp4 ... -o side_by_side.mp4     (client/compare.py)
    lwf-client watch 'http://HOST:8000/w/WORLD#token=TOKEN' --out watched.mp4   (client/watch_cli.py)
    lwf-client ... --save TITLE                                  saves the session at the end as a world (its id printed)
    lwf-client open|reopen WORLD_ID [--keys SCRIPT | --trajectory DIR]   (client/worlds/session.py)
    lwf-client worlds | export | import | delete ...             (client/worlds/commands.py)

The parser is client/cli_args.py; the exploration after the main session client/branch_run.py.

Exit codes: 0 done, 1 server or connection error, 2 bad input, 130 interrupted (Ctrl-C:
the session is reset and the socket closed). When the stream fails after some chunks came
(e.g. the socket dropped and the resume failed), the MP4 of those chunks is written anyway
and what happened is printed, then the exit code is 1. A server that does not answer within
--timeout (--queue-timeout while the session waits in its line), or whose reply the client
refuses (client/reply_guard.py), ends it with exit code 1 and one line; a refused reply is
never written.
"""
from __future__ import annotations

import argparse
import asyncio
import sys
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from tqdm import tqdm
from websockets.exceptions import ConnectionClosed, InvalidHandshake

from camera.frames import CHUNK_VIDEO_FRAMES, FIRST_CHUNK_VIDEO_FRAMES
from client.branch_run import BranchSpec, MainSession, run_branch
from client.cli_args import API_KEY_ENV, parser, prompt_at  # noqa: F401 (re-exported: the CLI's names)
from client.compare import compare
from client.compare_page import compare_page
from client.errors import BadReply, ReplyTimeout, ServerError, one_line
from client.local_paths import LocalPathError, check_folder, check_input, check_output, write_or_keep
from client.keydrive import KEYS_TRANSLATION_SCALE, KeyDriveLog, drive_keys, keys_num_frames
from client.recorder import SessionRecorder
from client.session import WorldClient
from client.stats import ChunkStat
from client.streaming import ResumePolicy, StreamResult
from client.synthetic import DEFAULT_PROMPT, default_image, synthetic_trajectory
from client.trajectory import Trajectory, plan_session
from client.watch_cli import run as run_watch
from client.worlds.session import WORLD_SESSION_COMMANDS, run_world_session, world_changed_hint
from client.worlds.commands import WORLD_COMMANDS, run as run_world_command
from media.pyav import MissingPyAV
from protocol.errors import ErrorCode, ProtocolError
from protocol.messages import FrameReply, Queued, Saved
from protocol.requests import SessionStart

EXIT_ERROR, EXIT_USAGE, EXIT_INTERRUPTED = 1, 2, 130


def frames_notice(requested: int, planned: int, poses: int) -> Optional[str]:
    """What `--frames` was rounded to and why, or None when it is made as asked."""
    if planned == requested:
        return None
    why = f"videos are {FIRST_CHUNK_VIDEO_FRAMES} frames for the first chunk, then {CHUNK_VIDEO_FRAMES} per chunk"
    if poses < requested:
        why = f"the trajectory has {poses} poses; {why}"
    return f"--frames {requested} rounded down to {planned}: {why}"


def trajectory_from_args(args: argparse.Namespace) -> Optional[Trajectory]:
    """The trajectory a command plays (loaded, or synthesised and optionally saved); None for `drive`."""
    if args.command == "drive":
        return None
    if args.command == "play":
        return Trajectory.load(args.inputs, prompt=args.prompt)
    shape = {k: getattr(args, k) for k in ("degrees", "radius", "distance") if hasattr(args, k)}
    image = args.image.read_bytes() if args.image is not None else None
    traj = synthetic_trajectory(args.command, args.frames, image=image,
                                prompt=args.prompt if args.prompt is not None else DEFAULT_PROMPT, **shape)
    if args.save_trajectory is not None:
        traj.save(args.save_trajectory)
    return traj


def branch_from_args(args: argparse.Namespace, frames: int) -> Optional[BranchSpec]:
    """--fork-at / --rewind-to and the branch's inputs (ValueError: inconsistent)."""
    given = [f for f in ("branch_trajectory", "branch_keys", "branch_prompt", "branch_out")
             if getattr(args, f) is not None]
    if args.fork_at is None and args.rewind_to is None:
        if given:
            raise ValueError(f"--{given[0].replace('_', '-')} needs --fork-at K or --rewind-to K")
        return None
    cameras = None
    if args.branch_trajectory is not None:
        bplan = plan_session(Trajectory.load(args.branch_trajectory, prompt=""), frames)
        cameras = [(p, bplan.chunk_intrinsics(k)) for k, p in enumerate(bplan.chunk_poses)]
    mode = "fork" if args.fork_at is not None else "rewind"
    return BranchSpec(mode, args.fork_at if mode == "fork" else args.rewind_to, cameras=cameras,
                      keys=args.branch_keys, prompt=args.branch_prompt)


def branch_out(args: argparse.Namespace) -> Path:
    return args.branch_out or args.out.with_name(f"{args.out.stem}.branch{args.out.suffix or '.mp4'}")


@dataclass
class _Run:
    """One CLI run's connection, progress and what it keeps."""

    client: WorldClient
    recorder: Optional[SessionRecorder]
    fragments: list[bytes] = field(default_factory=list)  # the main session's payloads, in order
    bar: Optional[tqdm] = None
    waiting_at: Optional[float] = None  # the first `queued` notice (the session waited in line)
    position: Optional[int] = None  # in line, as last told
    first_frame_at: Optional[float] = None
    saved: Optional[Saved] = None  # --save: the world it made
    save_error: Optional[ServerError] = None  # --save: why the server refused it

    def on_chunk(self, branch: str):
        def take(stat: ChunkStat, reply: FrameReply) -> None:
            self.first_frame_at = self.first_frame_at or time.perf_counter()
            if branch == "main":
                self.fragments.append(bytes(reply.video))
            if self.recorder is not None:
                self.recorder.reply(branch, reply)
            if self.bar is not None:
                self.bar.set_postfix_str(f"{branch} chunk {reply.chunk_id}: {1000 * stat.latency_s:.0f} ms, "
                                         f"{reply.resolution[0]}x{reply.resolution[1]}")
                self.bar.update(1)
        return take


async def play(args: argparse.Namespace, traj: Optional[Trajectory]) -> None:
    """Stream the main session (a trajectory, or a key script for `drive`), then the branch when
    asked; show progress, write the MP4s and print the summaries."""
    if traj is not None:
        plan = plan_session(traj, args.frames)
        notice = frames_notice(args.frames, plan.num_frames, len(traj.poses))
        if notice:
            print(notice, file=sys.stderr)
        chunks, frames = plan.num_chunks, plan.num_frames
    else:
        plan, chunks = None, len(args.script)
        frames = keys_num_frames(chunks)
    spec = branch_from_args(args, frames)  # validated before connecting
    if spec is not None:
        spec.check(chunks)
    sid = args.session_id or f"lwf-client-{uuid.uuid4().hex[:8]}"
    open_ended = args.save is not None  # a world to continue declares no length (`open` goes on past it)
    messages = None if traj is None else traj.messages(plan, sid, seed=args.seed, size=args.size, open_ended=open_ended,
                                                       prompt_schedule=dict(getattr(args, "prompt_at", None) or []))
    recorder = SessionRecorder(args.save_session) if args.save_session is not None else None
    if recorder is not None:
        recorder.inputs(traj, command=getattr(args, "argv", []), session_id=sid, num_frames=frames,
                        key_script=None if traj is not None else [list(k) for k in args.script],
                        branch=None if spec is None else {"mode": spec.mode, "at": spec.at})
    client = await WorldClient.connect(args.url, api_key=args.api_key, reply_timeout_s=args.timeout,
                                       queue_timeout_s=args.queue_timeout)
    run = _Run(client, recorder)
    todo = chunks + (0 if spec is None else (len(spec.keys) if spec.keys is not None else chunks - spec.at))
    label = f"{frames} frames" if spec is None else f"{frames} frames + {spec.mode} at {spec.at}"
    run.bar = tqdm(total=todo, unit="chunk", desc=label, file=sys.stderr)

    def on_queued(q: Queued) -> None:  # the session waits in the server's line (PROTOCOL.md, the waiting room)
        if run.waiting_at is None or q.position != run.position:
            eta = "" if q.eta_s is None else f", starts in about {q.eta_s:.0f} s"
            run.bar.write(f"waiting in the server's line: position {q.position}{eta}", file=sys.stderr)
        run.waiting_at = run.waiting_at or time.perf_counter()
        run.position = q.position
    client.on_queued = on_queued

    def on_busy(err: ServerError) -> None:
        run.bar.write(f"server busy: {err.message} (retrying in {err.retry_after_s:g} s)", file=sys.stderr)

    result = StreamResult(started_at=time.perf_counter())
    grace_s = client.config.resume_grace_s
    drive_log: Optional[KeyDriveLog] = None
    branch = None
    try:
        if messages is not None:
            resume = None if args.no_resume or not grace_s else ResumePolicy(sid)
            await client.stream(messages, pipeline=args.pipeline, on_chunk=run.on_chunk("main"), on_busy=on_busy,
                                resume=resume, into=result)
        else:
            image = args.image.read_bytes() if args.image is not None else default_image()
            start = SessionStart(image, args.prompt if args.prompt is not None else DEFAULT_PROMPT, seed=args.seed,
                                 size=args.size, num_frames=None if open_ended else frames,
                                 translation_scale=KEYS_TRANSLATION_SCALE)
            drive_log = await drive_keys(client, sid, args.script, into=result, start=start,
                                         on_chunk=run.on_chunk("main"))
        if args.save is not None:  # the main session, whole, as a world of the caller's (--save TITLE)
            try:
                run.saved = await client.save(sid, args.save)
            except ServerError as e:  # said after the video is written
                run.save_error = e
        if spec is not None:
            main = MainSession(sid, run.fragments, chunks,
                               chunk_cameras=None if plan is None else
                               [(p, plan.chunk_intrinsics(k)) for k, p in enumerate(plan.chunk_poses)],
                               chunk_keys=None if traj is not None else args.script)
            branch = await run_branch(client, main, spec, pipeline=args.pipeline, on_chunk=run.on_chunk("branch"),
                                      clock=time.perf_counter)
    except asyncio.CancelledError:  # Ctrl-C: leave the server clean
        await _reset_quietly(client, sid)
        raise
    except (ServerError, ConnectionClosed, OSError) as e:
        if len(run.fragments) < chunks:
            _keep_partial(args, result, chunks, sid, grace_s, e)
        else:  # the main session is whole: keep it; the fork or rewind (or its branch) failed
            _write_reporting(result.video.data, args.out, sid)
            print(f"wrote {args.out} (the main session, whole); the {spec.mode} at chunk {spec.at} failed",
                  file=sys.stderr)
        raise
    finally:
        run.bar.close()
        await client.close()
    write_or_keep(result.video.data, args.out, sid)
    if recorder is not None:
        recorder.video("main", result.video.data)
    summary = result.summary()
    replayed = "; replayed from the server's prefix store" if summary.replayed else ""
    print(f"wrote {args.out} ({summary.frames} frames at {client.config.fps} fps, session {sid}{replayed})")
    if run.waiting_at is not None and run.first_frame_at is not None:
        print(f"waited {run.first_frame_at - run.waiting_at:.1f} s in the server's line for a place (the time to "
              "first chunk below includes it)")
    if result.resumes:
        print(f"the connection dropped {result.resumes} time(s); resumed, {result.replayed} replies sent again")
    print(summary.format())
    if client.config.random_weights:  # as the page says on its video (the handshake's `random_weights`)
        print(f"the server's {client.config.model} model has random weights: the video is coloured noise that "
              "follows the camera (README.md, \"Real weights on a GPU\", loads the released ones)")
    if drive_log is not None:
        _print_lags(drive_log)
    if branch is not None:
        bsid, bresult, blog = branch
        out = branch_out(args)
        write_or_keep(bresult.video.data, out, bsid)
        if recorder is not None:
            recorder.video("branch", bresult.video.data)
        done = "forked" if spec.mode == "fork" else "rewound"
        breplayed = "; replayed from the server's prefix store" if bresult.summary().replayed else ""
        print(f"{done} at chunk {spec.at}: wrote {out} ({len(bresult.stats)} new chunks after "
              f"{spec.at} kept, session {bsid}{breplayed})")
        if blog is not None:
            _print_lags(blog)
    if recorder is not None:
        print(f"saved the session in {recorder.folder}")
    if run.saved is not None:
        print(f"saved session {sid} as world {run.saved.world_id} ({run.saved.chunks} chunks, \"{args.save}\"): "
              f"lwf-client open {run.saved.world_id} --keys w:2 continues it")
    if run.save_error is not None:
        raise run.save_error


def _print_lags(log: KeyDriveLog) -> None:
    lags = sorted(log.control_lags_s)
    if lags:
        print(f"control lag (control sent -> first frame with its event_id): median "
              f"{1000 * lags[len(lags) // 2]:.0f} ms, max {1000 * lags[-1]:.0f} ms over {len(lags)} key states")
    if log.others_chunks:
        print(f"{log.others_chunks} of {len(log.players)} chunks were made from other players' input "
              "(a shared world): not counted in the control lag")


def _keep_partial(args: argparse.Namespace, result: StreamResult, chunks: int, sid: str,
                  grace_s: Optional[float], error: BaseException) -> None:
    """The stream failed: write the chunks received so far, and say what happened and what can
    be done (the session id and token let any client resume it while the server keeps it)."""
    if not result.stats:
        return
    if not _write_reporting(result.video.data, args.out, sid):
        return
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


def _write_reporting(data: bytes, path: Path, name: str) -> bool:
    """Write what was received while another error is being reported; a failed write is said
    (where the video was kept instead) without hiding that error."""
    try:
        write_or_keep(data, path, name)
        return True
    except LocalPathError as e:
        print(f"error: {e}", file=sys.stderr)
        return False


def check_local_paths(args: argparse.Namespace) -> None:
    """Every local path the command reads or writes, before it connects (LocalPathError)."""
    if args.command == "compare":
        for video in args.videos:
            check_input(video, "VIDEO")
        check_output(args.out, "-o")
        return
    check_output(args.out, "--out")
    if getattr(args, "fork_at", None) is not None or getattr(args, "rewind_to", None) is not None:
        check_output(branch_out(args), "--branch-out")
    if getattr(args, "image", None) is not None:
        check_input(args.image, "--image")
    for option in ("save_session", "save_trajectory"):
        if getattr(args, option, None) is not None:
            check_folder(getattr(args, option), f"--{option.replace('_', '-')}")


async def _reset_quietly(client: WorldClient, session_id: str) -> None:
    try:
        await client.reset(session_id)
    except (ServerError, ConnectionClosed, asyncio.TimeoutError, OSError):
        pass  # the server frees the session when the socket closes anyway


def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = list(argv) if argv is not None else sys.argv[1:]
    args = parser().parse_args(argv)
    args.argv = argv  # --save-session keeps the command line
    if args.command in WORLD_COMMANDS:  # the server's saved worlds over HTTP (worlds/commands.py)
        return run_world_command(args)
    if args.command == "watch":  # a world someone shares (watch_cli.py)
        return run_watch(args)
    try:
        check_local_paths(args)
    except LocalPathError as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_USAGE
    if args.command == "compare":
        if args.out.suffix.lower() in (".html", ".htm"):  # played by the browser: nothing decoded here
            try:
                n = compare_page(args.videos, args.out, args.labels)
            except ValueError as e:
                print(f"error: {e}", file=sys.stderr)
                return EXIT_USAGE
            except OSError as e:
                print(f"error: -o {args.out}: cannot write ({e.strerror or e})", file=sys.stderr)
                return EXIT_USAGE
            print(f"wrote {args.out} ({n} videos side by side in one page: open it in a browser)")
            return 0
        try:
            frames, (h, w) = compare(args.videos, args.out, args.labels)
        except MissingPyAV as e:  # the core install, without the `video` extra
            print(f"error: {e}; or write a page that plays them side by side: -o {args.out.with_suffix('.html')}",
                  file=sys.stderr)
            return EXIT_USAGE
        except ValueError as e:
            print(f"error: {e}", file=sys.stderr)
            return EXIT_USAGE
        except OSError as e:  # the folder went away or filled up after the check
            print(f"error: -o {args.out}: cannot write ({e.strerror or e})", file=sys.stderr)
            return EXIT_USAGE
        print(f"wrote {args.out} ({frames} frames, {w}x{h}: {len(args.videos)} videos side by side)")
        return 0
    try:
        traj = None if args.command in WORLD_SESSION_COMMANDS else trajectory_from_args(args)
    except (ValueError, OSError) as e:  # unreadable or inconsistent input files
        print(f"error: {e}", file=sys.stderr)
        return EXIT_USAGE
    try:  # open / reopen: a saved world continued (client/worlds/session.py)
        asyncio.run(run_world_session(args) if args.command in WORLD_SESSION_COMMANDS else play(args, traj))
    except LocalPathError as e:  # a write that failed after the checks (the video was kept elsewhere)
        print(f"error: {e}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("interrupted: session reset, connection closed", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BadReply as e:  # nothing of it was kept
        print(f"error: refused the server's reply: {one_line(e.message)}", file=sys.stderr)
        return EXIT_ERROR
    except ReplyTimeout as e:
        option = "--queue-timeout" if e.in_line else "--timeout"
        print(f"error: {one_line(e.message)} ({option} S sets it)", file=sys.stderr)
        return EXIT_ERROR
    except ServerError as e:
        print(f"server error ({e.code.value}): {one_line(e.message)}", file=sys.stderr)
        if e.code is ErrorCode.WORLD_CHANGED and args.command == "open":
            print(world_changed_hint(args.world_id), file=sys.stderr)
        return EXIT_ERROR
    except ProtocolError as e:  # caught before sending: the server would answer the same code
        print(f"invalid input ({e.code.value}): {e.message}", file=sys.stderr)
        return EXIT_USAGE
    except ConnectionClosed as e:
        rcvd = e.rcvd
        why = f"code {rcvd.code}: {one_line(rcvd.reason) or 'no reason given'}" if rcvd else "no close frame"
        print(f"error: the server closed the connection ({why})", file=sys.stderr)
        return EXIT_ERROR
    except (OSError, InvalidHandshake) as e:  # includes TimeoutError
        print(f"error: cannot reach the server at {args.url}: {e}", file=sys.stderr)
        return EXIT_ERROR
    except ValueError as e:  # e.g. too few frames for one chunk, a malformed --url, a branch out of range
        print(f"error: {e}", file=sys.stderr)
        return EXIT_USAGE
    return 0


if __name__ == "__main__":
    sys.exit(main())
