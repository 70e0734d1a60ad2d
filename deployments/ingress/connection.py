"""Connection: one WebSocket of `/v1/realtime/world/camera` (PROTOCOL.md).

One receive loop decodes frames and dispatches them *synchronously*: dispatch never awaits
model work, so the loop keeps reading while chunks are in flight. Each infer becomes three
calls, queued at once on the connection's two lanes (one per stateful deployment, serial):

    VAE lane:  open, condition(0), condition(1), decode(0), condition(2), decode(1), ...
    DiT lane:  text + open, step(0), step(1), step(2), ...

`step(k)` waits for `condition(k)`; when it returns it queues `decode(k)` on the VAE lane, so
the DiT can run chunk k+1 while the VAE decodes chunk k. Replies leave through one ordered
outbox: in request order, whatever finishes first. Every call carries the session's key as
Serve session id (`handle.options(session_id=key)`), which the affinity router pins.

Each session keeps a journal (journal.py). A call that finds its replica dead or the session
gone rebuilds the session from it on a healthy replica (recovery.py), inside the same lane
job (lane_jobs.py), and is made again: the client sees a slower chunk, not an error. A new
live session waits its turn in the application's line first (line/). Abuse limits
(`ClientPolicy`) close the socket with 1008 and a reason; per-key quotas answer `busy`.
"""
from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any, Optional

from fastapi import WebSocketDisconnect
from pydantic import BaseModel

from camera import CHUNK_LATENT_FRAMES, parse_size
from deployments.ingress.guards.client_policy import ClientPolicy
from deployments.config import AppArgs
from deployments.ingress.history.branching import Branches
from deployments.ingress.resuming.claims import Claims
from deployments.ingress.controls import ChunkCameras, ControlBook
from deployments.ingress.detached import detach
from deployments.ingress.drive.binding import Binding, late_bound_step
from deployments.ingress.drive.driving import Driving
from deployments.errors import ReplicaError
from deployments.ingress.image_intake import FrameImage
from deployments.ingress.journal import SessionJournal
from deployments.ingress.lanes import Backends, Lane, ReplicaLanes
from deployments.ingress.lane_jobs import LaneJobs
from deployments.ingress.line.seat import LineSeats
from deployments.log import get_log
from deployments.metrics import IngressMetrics
from deployments.ingress.guards.quotas import KeyQuota
from deployments.ingress.prefix.reuse import PrefixReuse, scope_of
from deployments.ingress.prefix.store import PrefixStore, StoredChunk
from deployments.ingress.history.recovery import Recovery
from deployments.ingress.releases import Releases
from deployments.ingress.outbox import Outbox
from deployments.ingress.replies import Replies
from deployments.ingress.resume import ResumeBook
from deployments.ingress.sharing.fork import WatchForks
from deployments.ingress.sharing.owner import Sharing
from deployments.ingress.sizes import SizeRule
from deployments.ingress.stream import Stream, StreamState, image_digest, session_options
from deployments.ingress.transport import Transport, frame_size, next_message, oversize, session_traits
from deployments.ingress.worlds import SessionWorlds, WorldKeeping, WorldRequests
from deployments.ingress.worlds.reopen import Reopening
from protocol.codec import decode
from protocol.errors import ErrorCode, ProtocolError
from protocol.limits import Limits
from protocol.messages import (AckRequest, CameraServerConfig, ControlRequest, DriveRequest, ForkRequest, FrameReply,
                               InferRequest, OpenRequest, Request, ResetRequest, ResumeRequest, RewindRequest,
                               ReopenRequest, SaveRequest, require_session_start)

PIPELINE_RETRY_S = 0.5  # retry hint when a client has max_pending_chunks infers in flight
POLICY_VIOLATION = 1008
INTERNAL_ERROR = 1011
FLUSH_BEFORE_CLOSE_S = 1.0  # a policy close first sends the replies already queued, this long at most
MIB = 1024 * 1024


class Connection:
    """Serves one accepted socket (a WebSocket, or `LocalTransport` for `POST /v1/videos`) until
    the client leaves; releases its sessions after.

    It owns: the two lanes; `LaneJobs` (the calls a chunk makes on them, lane_jobs.py);
    `Replies` (frame replies, errors, notices, replies.py) and the `Outbox` they leave through
    in order (outbox.py); `Releases` (the streams the replicas may hold, freed on reset,
    failure and the socket's end, releases.py); `ResumeBook` (parking and claims, resume.py)
    and `Claims` (a frame that claims a parked session, resuming/claims.py);
    `ControlBook` (the keys held, controls.py); `Driving` (its driven session's driver, which
    starts chunks through `_queue_chunk` as an infer does, drive/driving.py). It keeps the
    current stream and the chunks in flight."""

    def __init__(self, ws: Transport, backends: Backends, args: AppArgs, limits: Limits,
                 handshake: CameraServerConfig, metrics: IngressMetrics, quota: Optional[KeyQuota] = None,
                 key_id: Optional[str] = None, client: Optional[str] = None, resumable: bool = False,
                 prefix: Optional[tuple[PrefixStore, str, Any]] = None, worlds: Optional[WorldKeeping] = None) -> None:
        """`quota`: the per-API-key quota this connection counts against (None: unlimited);
        `key_id`, `client`: its API key id (auth on) and address, whom a resume must match;
        `resumable`: its sessions may outlive it (a WebSocket, when the app parks sessions);
        `prefix`: the ingress replica's prefix store, the model's fingerprint and the store's
        metrics (None: no store); `worlds`: the replica's world store (its sessions kept there)."""
        self._ws = ws
        self._args = args
        self._limits = limits
        self._handshake = handshake
        self._quota = quota
        self._id = uuid.uuid4().hex[:8]
        self._log = get_log("connection", conn=self._id)
        self._policy = ClientPolicy(args.connection, limits.max_message_bytes)
        self._sizes = SizeRule(tuple(args.model.bucket_sizes()), args.model.max_output_area)
        seats = LineSeats(backends.room, lambda notice: self._outbox.notice(notice), self._log,  # line/seat.py
                          metrics.observe_session_fps, args.sessions.yield_idle_s, args.sessions.max_turn_s)
        replicas = ReplicaLanes(backends, Lane("dit"), Lane("vae"), args, self._log, line=seats)
        self._dit_lane, self._vae_lane = replicas.dit_lane, replicas.vae_lane
        self._jobs = LaneJobs(replicas, Recovery(backends.dit, backends.vae, args.sessions, self._log, metrics), seats)
        self._releases = Releases(replicas, quota, metrics, ended=lambda s: (seats.end(s), self._sharing.ended(s)))
        seats.yields_through(self._releases.retire, lambda notice, stream: self._outbox.reply_now(notice, stream))
        self._principal = scope_of("principal", key_id, client, self._id)  # owns its sessions' text cache, snapshots
        kept = None if worlds is None or not resumable else SessionWorlds(  # worlds/: its sessions' worlds
            worlds, self._principal, lambda n: self._outbox.notice(n), lambda s: self._resume.digest_of(s))
        self._resume = ResumeBook(replicas, self._releases, quota, may_park=resumable, key_id=key_id, client=client,
                                  clip_mode=lambda: bool(getattr(ws, "raw_frames", False)), worlds=kept)
        self._worlds = WorldRequests(kept, self._releases, self._resume, lambda: self._driving.stop())  # save, open
        self._watch_forks = WatchForks(backends.hub, args, self._principal, self._releases, self._resume,
                                       lambda: self._driving.stop())  # a fork of a shared world (sharing/fork.py)
        self._reopen = Reopening(kept, args, limits, lambda: self._inflight, lambda: self._stream, self._dispatch)
        self._replies = Replies(args, handshake, metrics, self._log, lost=self._releases.fail,
                                token=self._resume.token, kept=None if kept is None else kept.kept)
        self._outbox = Outbox(ws, on_sent=lambda s, r: (isinstance(r, FrameReply) and self._resume.record_sent(s, r),
                                                        self._sharing.sent(s, r)),  # (a pause: its world's notice)
                              on_reply=self._policy.on_reply)
        self._controls = ControlBook(args.controls)  # the keys held and the camera they move (controls.py)
        self._driving = Driving(args, backends, self._controls, self._log, start=self._start_driven,  # `drive`
                                put_paused=lambda p: self._outbox.reply_now(p, self._stream),
                                sent_chunks=self._resume.sent_chunks)
        store, fingerprint, prefix_metrics = prefix if prefix is not None else (None, "", None)
        self._sharing = Sharing(backends.hub, args, self._principal, self._log, self._replies.error,  # its worlds
                                on_input=self._driving.wake, notice=self._outbox.notice)  # players' keys, `players`
        self._controls.world = self._sharing.inputs_for  # a shared session's keys go through its world's policy
        self._prefix = PrefixReuse(replicas, store, fingerprint, scope_of(args.prefix_cache.scope, key_id, client,
                                                                          self._id),
                                   handshake, prefix_metrics, token=self._resume.token)  # prefix/reuse.py
        self._branches = Branches(replicas, self._releases, self._replies,  # fork, rewind, forks held (branching.py)
                                  followers=(self._resume, self._prefix, self._controls))
        self._stream: Optional[Stream] = None
        self._inflight: set[asyncio.Task] = set()  # chunks not yet answered
        self._image = FrameImage(limits)  # the pixels of the frame in hand (image_intake.py)
        self._claims = Claims(self._resume, self._sharing, self._driving, self._outbox, self._replies, self._log,
                              lambda: self._stream, partial(setattr, self, "_stream"))  # resume, check

    async def run(self) -> None:
        """Handshake, receive loop, cleanup (always)."""
        sender = asyncio.create_task(self._outbox.send_loop())
        self._outbox.reply_now(self._handshake)
        try:
            while True:
                msg = await next_message(self._ws, lambda: self._policy.wait_s(busy=bool(self._inflight)))
                if msg is None:
                    await self._outbox.close_socket(POLICY_VIOLATION, self._policy.silence_reason())
                    break
                if msg["type"] == "websocket.disconnect":
                    break
                data = msg.get("bytes")
                violation = self._policy.on_frame(len(self._outbox), frame_size(msg))
                if violation is None:
                    refused, infer = await self._handle(data, time.perf_counter(), oversize(msg, self._limits))
                    violation = self._policy.on_outcome(refused, infer)
                del msg, data  # a large frame is not kept alive while waiting for the next
                if violation is not None:
                    await self._outbox.flush(FLUSH_BEFORE_CLOSE_S)  # e.g. the last refusal's error
                    await self._outbox.close_socket(POLICY_VIOLATION, violation)
                    break
        except WebSocketDisconnect:
            pass
        except Exception:  # noqa: BLE001 - the connection edge: state unknown, close the socket
            self._log.exception("fatal error; closing the connection")
            await self._outbox.close_socket(INTERNAL_ERROR, "internal server error")
        finally:
            # Releasing must finish even if Serve cancels this handler: it runs detached, and
            # the handler waits for it (bounded) so that the connection is counted until then.
            sender.cancel()
            if sender.done() and not sender.cancelled():
                sender.exception()  # a send failed: the client is gone (retrieved, not logged)
            teardown = detach(self._teardown(), name=f"teardown-{self._id}")
            await asyncio.wait({teardown}, timeout=self._args.connection.release_timeout_s + 5.0)

    async def _teardown(self) -> None:
        """The open session goes to the parking if it can (resume.py); every other is released."""
        driven = self._driving.drives(self._stream)
        self._driving.stop()  # no chunk starts after the socket's end
        self._reopen.stop()  # nor a reopened world's next infer
        parked = self._stream if await self._resume.park(self._stream, driven) else None
        if parked is not None:
            self._stream = None
        await self._releases.teardown(parked, self._inflight)
        self._sharing.leave(parked)  # a parked session's world waits for its resume; the others end

    # ---- dispatch (synchronous: fixes the order of every call and reply) ----

    async def _handle(self, data: Optional[bytes], t0: float,
                      kept_back: Optional[ProtocolError] = None) -> tuple[bool, bool]:
        """Handle one frame: (refused: answered with an error, infer: an accepted infer). A
        frame that resumes a session waits for its claim (resume.py) before the next is read.
        `kept_back`: the proxy guard kept the frame back as too large (its refusal)."""
        try:
            if kept_back is not None:
                raise kept_back
            if data is None:
                raise ProtocolError(ErrorCode.BAD_MESSAGE, "send binary frames holding one msgpack map, not text")
            req = decode(data, self._limits)
        except ProtocolError as e:
            self._outbox.reply_now(self._replies.error(e.code, e.message, e.session_id))
            return True, False
        kind = self._resume.kind(req, self._stream)  # a claim of a parked session (resuming/claims.py)
        if kind is not None and (outcome := await self._claims.handle(req, kind)) is not None:
            return outcome
        if isinstance(req, (SaveRequest, OpenRequest)) or getattr(req, "of_world", False):  # an open, a fork of a
            handler = self._watch_forks if isinstance(req, ForkRequest) else self._worlds  # shared world: loaded
            self._stream = await handler.handle(req, self._stream, self._outbox)  # before the next frame is read
            return False, False
        if isinstance(req, ReopenRequest):  # its first infer now, the others as chunks finish (worlds/reopen.py)
            await self._reopen.handle(req, self._outbox, lambda infer: self._accept(infer, t0))
            return False, False
        return await self._accept(req, t0)

    async def _accept(self, req: Request, t0: float) -> tuple[bool, bool]:
        """A decoded request that resumes nothing: its image decoded, then dispatched."""
        cur = self._stream
        if isinstance(req, (InferRequest, DriveRequest)) and req.image is not None and (
                isinstance(req, DriveRequest) or cur is None or not cur.holds(req.session_id, req.image)):
            try:  # the pixels decode off the event loop (image_intake.py); dispatch takes them
                await self._image.decode(req.image)
            except ProtocolError as e:
                self._outbox.reply_now(self._replies.error(e.code, e.message, req.session_id))
                return True, False
        try:
            return self._dispatch(req, t0)
        finally:
            self._image.clear()

    def _dispatch(self, req: Request, t0: float) -> tuple[bool, bool]:
        """Handle one decoded request: (refused: answered with an error, infer: an accepted infer)."""
        session_id = req.session_id
        try:
            if isinstance(req, ResumeRequest):  # for the session this connection holds
                for reply in self._resume.replay_held(req, self._stream):
                    self._outbox.reply_now(reply, self._stream if isinstance(reply, FrameReply) else None)
                return False, False
            if isinstance(req, (ForkRequest, RewindRequest)) and self._driving.driven(self._stream, session_id):
                raise ProtocolError(ErrorCode.BAD_MESSAGE, "a driven session (`drive`) cannot be forked or rewound; "
                                                           "reset it, or branch a session driven by infers")
            if (answer := self._sharing.answer(req, self._stream)) is not None:  # share, unshare (sharing/owner.py)
                self._outbox.put(answer)
                return False, False
            if isinstance(req, ForkRequest):
                self._outbox.put(self._branches.fork(req, self._stream))
                return False, False
            if isinstance(req, RewindRequest):
                self._outbox.put(self._branches.rewind(req, self._stream))
                return False, False
            self._stream = self._branches.switch(session_id, self._stream)  # a forked session it holds
            self._driving.keep_only(self._stream)  # no longer the current one: driven by infers from now on
            if isinstance(req, ResetRequest):
                self._on_reset(req)
                return False, False
            if isinstance(req, ControlRequest):  # no reply: the frames echo its event_id
                self._controls.set(req)
                self._driving.control(req)
                return False, False
            if isinstance(req, AckRequest):
                self._driving.ack(req, self._stream)
                return False, True
            if isinstance(req, DriveRequest):
                self._on_drive(req)
                return False, True
            self._on_infer(req, t0)
            return False, True
        except ProtocolError as e:
            self._outbox.reply_now(self._replies.error(e.code, e.message, session_id or e.session_id))
        except ReplicaError as e:  # a quota of the API key (busy)
            self._outbox.reply_now(self._replies.error(e.code, e.message, session_id,
                                                       getattr(e, "retry_after_s", None)))
            return False, False  # a busy answer is not the client's fault
        return True, False

    def _on_reset(self, req: ResetRequest) -> None:
        cur = self._stream
        release = None
        self._controls.forget(req.session_id)
        if cur is not None and cur.spec.session_id == req.session_id:
            self._driving.stop()
            self._stream = None
            release = self._releases.close(cur)
        self._outbox.put(asyncio.ensure_future(self._replies.reset_ok(req.session_id, release)))

    def _on_infer(self, req: InferRequest, t0: float) -> None:
        if self._driving.driven(self._stream, req.session_id):
            raise ProtocolError(ErrorCode.BAD_MESSAGE, "this session is driven by the server (`drive`): send "
                                                       "`control` and `ack`, not infers; reset it to drive it by infers")
        if len(self._inflight) >= self._args.sessions.max_pending_chunks:
            self._outbox.reply_now(self._replies.error(
                ErrorCode.BUSY, f"{len(self._inflight)} infers of this connection are in flight (the most "
                "it may have); wait for a reply, then send this chunk again", req.session_id, PIPELINE_RETRY_S))
            return
        stream, reset = self._stream_for(req)  # validates first: a refused infer spends no quota
        total = stream.spec.total_latent_frames
        if total is not None and stream.next_chunk >= total // CHUNK_LATENT_FRAMES:  # a limit reached, not a size
            self._outbox.reply_now(self._replies.session_limit(stream, 0, declared=total // CHUNK_LATENT_FRAMES))
            return
        max_chunks = self._args.sessions.max_chunks
        if stream.next_chunk >= max_chunks:
            self._outbox.reply_now(self._replies.session_limit(stream, 0))
            return
        cams = self._controls.chunk(stream, req)  # explicit, or from the keys held
        director = None if reset or req.prompt_update else self._sharing.steering(stream, take=False)
        steer = None if reset else req.prompt_update or director  # or its world's director's
        key = self._prefix.key(stream, cams.poses, cams.intrinsics, steer)
        hit = self._prefix.find(stream, key)  # the chunk as stored (prefix/reuse.py), or None
        if self._quota is not None:
            self._quota.take_chunk()
        if director is not None:
            self._sharing.steering(stream)  # taken once the chunk is accepted: a refused one leaves it pending
        self._queue_chunk(stream, cams, t0, client_chunk_id=req.client_chunk_id, reset=reset,
                          prompt_update=steer, prefix_key=key, hit=hit)

    def _queue_chunk(self, stream: Stream, cams: Optional[ChunkCameras], t0: float, *,
                     client_chunk_id: Optional[int] = None, reset: bool = False, prompt_update: Optional[str] = None,
                     prefix_key: Optional[str] = None, hit: Optional[StoredChunk] = None,
                     driven: Optional[tuple[Callable[[], None], Binding]] = None) -> asyncio.Task:
        """Queue `stream`'s next chunk (quota already taken): served from the prefix store when
        `hit`, else on the lanes; its reply task. `cams` None: a driven chunk, its camera bound
        from the keys when its DiT job starts (drive/binding.py: in `driven`'s binding), which
        then calls `driven`'s callback."""
        max_chunks = self._args.sessions.max_chunks
        chunk_id = stream.take_chunk_id()
        camera: ChunkCameras | asyncio.Future[ChunkCameras]
        if cams is not None:
            self._controls.commit(stream, cams, chunk_id)
            camera = cams
        else:
            camera = asyncio.get_running_loop().create_future()
        if hit is not None and prefix_key is not None:
            reply = self._prefix.serve(stream, prefix_key, hit, chunk_id, prompt_update, client_chunk_id, reset, t0)
        else:
            self._prefix.computing(stream, prefix_key, self._jobs.open)  # materialised first, if need be
            reply = self._prefix.recorded(stream, chunk_id, self._compute(
                stream, chunk_id, camera, t0, client_chunk_id, reset, prompt_update, driven))
        task = asyncio.create_task(self._controls.annotate(reply, camera))
        stream.chunk_tasks.append(task)
        self._inflight.add(task)
        task.add_done_callback(self._inflight.discard)
        self._outbox.put(task, stream)
        if chunk_id == max_chunks - 2:  # one chunk before the limit: a notice after this chunk's reply
            self._outbox.put(asyncio.ensure_future(self._replies.notice_after(task, stream)))
        self._log.debug("chunk queued", fields={"session": stream.key, "chunk": chunk_id})
        return task

    def _compute(self, stream: Stream, chunk_id: int, camera: ChunkCameras | asyncio.Future[ChunkCameras], t0: float,
                 client_chunk_id: Optional[int], reset: bool, prompt_update: Optional[str],
                 driven: Optional[tuple[Callable[[], None], Binding]]) -> Awaitable[BaseModel]:
        """Queue the chunk's calls on the lanes; its reply. `camera` a future: bound late."""
        timings: dict[str, float] = {}
        context = None
        if prompt_update is not None:
            context = self._jobs.encode_later(prompt_update, stream.spec.owner)
            stream.steer(chunk_id, prompt_update)
        y = self._vae_lane.submit(partial(self._jobs.condition, stream, timings))
        if isinstance(camera, ChunkCameras):
            step = self._dit_lane.submit(partial(self._jobs.step, stream, y, camera.poses, camera.intrinsics, context))
        else:
            dit_started, binding = driven if driven is not None else ((lambda: None), Binding())
            step = self._dit_lane.submit(partial(late_bound_step, self._jobs, self._controls, stream, binding, chunk_id,
                                                 y, camera, dit_started, self._args.controls.preempt))
        return self._replies.finish_chunk(stream, chunk_id, step, timings, client_chunk_id, reset, t0)

    # ---- driven sessions (`drive`, drive/driving.py) ----

    def _on_drive(self, req: DriveRequest) -> None:
        """Open a session the server runs (validated as a first infer; it replaces the current one)."""
        # not through the prefix store: a driven chunk's camera is bound when its DiT job starts,
        # after the store would have been asked for it
        infer = req.as_infer().model_copy(update={"prefix_cache": False})
        require_session_start(infer)
        self._driving.start(self._replace(infer))  # validates, admits, releases the current one

    def _start_driven(self, stream: Stream, dit_started: Callable[[], None], binding: Binding) -> asyncio.Task:
        if self._quota is not None:
            self._quota.take_chunk()  # Busy: the driver waits
        return self._queue_chunk(stream, None, time.perf_counter(), driven=(dit_started, binding),
                                 prompt_update=self._sharing.steering(stream))  # its world's director's

    def _stream_for(self, req: InferRequest) -> tuple[Stream, bool]:
        """The stream this infer continues, or a new one; True when a change reset the session.

        `prompt_update` (prompt steering) continues the open session: its image and prompt, when
        sent, must be the session's (or the update itself); a changed `prompt` without it resets."""
        cur = self._stream
        if req.prompt_update is not None:
            if cur is None or cur.spec.session_id != req.session_id or cur.state is not StreamState.OPEN:
                raise ProtocolError(ErrorCode.BAD_MESSAGE if cur is None or cur.spec.session_id != req.session_id
                                    else ErrorCode.SESSION_LOST,
                                    "`prompt_update` steers an open session; start a session with image and "
                                    "prompt first (the server does not hold this one)")
            if (req.image is not None and not cur.same_image(req.image)) or (
                    req.prompt is not None and req.prompt not in (cur.prompt, req.prompt_update)):
                raise ProtocolError(ErrorCode.BAD_MESSAGE, "an infer with `prompt_update` continues the session: "
                                                           "leave out `image` and `prompt` (or send the session's)")
            return cur, False
        if cur is not None and cur.spec.session_id == req.session_id:
            if cur.state is StreamState.OPEN:
                changed = (req.prompt is not None and req.prompt != cur.prompt) or (
                    req.image is not None and not cur.same_image(req.image))
                if not changed:
                    return cur, False
                # Implicit reset: what the infer does not repeat is the current session's.
                return self._replace(req, inherit=cur), True
            if req.image is None or req.prompt is None:
                raise ProtocolError(ErrorCode.SESSION_LOST, "the server no longer holds this session; "
                                                            "send image and prompt to start it again")
        return self._replace(req), False

    def _replace(self, req: InferRequest, inherit: Optional[Stream] = None) -> Stream:
        """Open a new stream for `req` (validated first), then release the current one.
        `inherit`: the session an implicit reset replaces; its image or prompt stands in for
        the one `req` does not carry."""
        if inherit is not None and (req.image is None) != (req.prompt is None):
            prompt = req.prompt if req.prompt is not None else inherit.prompt
            image, digest = (inherit.image, inherit.spec.image_digest) if req.image is None else (
                self._image.pixels(req.image), image_digest(req.image))
        else:
            require_session_start(req)
            prompt, image, digest = req.prompt, self._image.pixels(req.image), image_digest(req.image)
        max_area = req.max_area or parse_size(self._args.model.default_size)
        resolution = self._sizes.output(max_area, *image.shape[:2])  # buckets, bounds (ProtocolError)
        spec = session_options(req, resolution, prompt, digest, principal=self._principal, **session_traits(self._ws))
        sessions = self._args.sessions
        stream = Stream(spec, SessionJournal(image, int(sessions.journal_max_mib * MIB) if sessions.recovery else None),
                        image)
        if self._resume.enabled and spec.raw_frames:  # a clip session: its client's parked one of that id is replaced
            self._resume.forget_parked_clip(spec.session_id)
        self._resume.issue(stream)  # its resume token, when sessions may outlive the socket
        self._releases.adopt(stream, replacing=self._stream)
        self._driving.stop()  # a driven session is replaced
        self._stream = stream
        self._jobs.seats.expect(stream, req.queue_token)  # a new live session waits its turn in line
        if not self._prefix.attach(stream, req):  # else opened (or restored) when its first chunk that is not
            self._jobs.open(stream)              # stored comes (prefix/reuse.py)
        h, w = spec.resolution
        self._log.info("session started", fields={"session": req.session_id, "key": stream.key,
                                                  "resolution": f"{h}x{w}"})
        return stream
