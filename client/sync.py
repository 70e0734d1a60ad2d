"""A synchronous client beside the async `WorldClient`: for a robot's loop, a game or a notebook.

    with SyncWorldClient("ws://127.0.0.1:8000") as c:
        chunk = c.infer("s1", poses, intrinsics, start=SessionStart(image, "a street"))
        chunk.video           # the chunk's fMP4 bytes (the session's first holds the init segment)
        chunk.frames          # uint8 [T, H, W, 3], decoded with PyAV when first read
        shared = c.share("s1")                                   # a world others watch
        with c.watch(shared.world_id, shared.watch_token) as w:  # or watch(link): no session needed
            item = next(w)    # a Chunk of the world, or a `world` notice (viewers, ended, ...)

Each method sends one request and waits for its answer, on an event loop of its own thread
(so it works where a loop already runs, as in Jupyter). Frames are decoded chunk by chunk:
every chunk starts with an IDR frame, so a chunk decodes with the session's init segment
alone, and equals what PyAV decodes from the whole file (`Video.data`). The decode needs PyAV,
the client's `video` extra: without it `chunk.frames` raises `MissingPyAV` (an ImportError
naming the extra) and the bytes are all there is.
"""
from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Coroutine, Iterable, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Optional, TypeVar

import numpy as np

from camera.plan import plan_session
from client.errors import BadReply, ServerError
from client.session import DEFAULT_QUEUE_TIMEOUT_S, DEFAULT_REPLY_TIMEOUT_S, WorldClient, default_url
from client.watching import Watcher, watch_target
from media.reassembly import decode_fragment, split_init
from protocol.codec import encode, validated
from protocol.errors import ErrorCode
from protocol.messages import (CameraServerConfig, ErrorReply, Forked, FrameReply, Opened, Paused, ResetOk, ResumeOk,
                               ResumeRequest, Reopened, Rewound, Saved)
from protocol.requests import SessionStart, plan_requests
from protocol.sharing import Shared, Unshared, Watching, WorldNotice

T = TypeVar("T")


@dataclass(frozen=True)
class Chunk:
    """One frame reply: its fMP4 bytes, and its frames decoded when first read."""

    video: bytes  # this reply's fMP4 payload
    reply: FrameReply  # chunk_id, cached, event_id, poses, stage_durations, ...
    init: bytes = field(default=b"", repr=False)  # the session's init segment, when `video` has none

    @cached_property
    def frames(self) -> np.ndarray:
        """uint8 [T, H, W, 3], decoded with PyAV (MissingPyAV without the `video` extra;
        `BadReply` when the server's video does not decode)."""
        try:
            return decode_fragment(self.init, self.video)
        except ImportError:
            raise
        except Exception as e:  # noqa: BLE001 (PyAV's errors: what the server sent is no video)
            what = "a chunk" if self.reply is None else f"chunk {self.chunk_id} of session {self.reply.session_id!r}"
            raise BadReply(f"{what} does not decode ({type(e).__name__}: {e})") from None

    @property
    def chunk_id(self) -> int:
        return self.reply.chunk_id


@dataclass
class Video:
    """A session's chunks so far: `frames` [T, H, W, 3] and `data`, the MP4 of their payloads."""

    chunks: list[Chunk] = field(default_factory=list)

    @property
    def frames(self) -> np.ndarray:
        return np.concatenate([c.frames for c in self.chunks])

    @property
    def data(self) -> bytes:
        return b"".join(c.video for c in self.chunks)


class SyncWorldClient:
    """One connection; `close()` (or `with`) ends it. `url`: default `$LWF_URL`, else the local
    server. `ServerError` for an error reply (`BadReply`: a reply this client refuses),
    `ReplyTimeout` for none within `reply_timeout_s` (`queue_timeout_s` while it waits in the
    server's line), `ProtocolError` for a request the server would refuse, `OSError` when it
    cannot connect."""

    def __init__(self, url: Optional[str] = None, api_key: Optional[str] = None, *,
                 reply_timeout_s: float = DEFAULT_REPLY_TIMEOUT_S,
                 queue_timeout_s: float = DEFAULT_QUEUE_TIMEOUT_S) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="lwf-client-loop", daemon=True)
        self._thread.start()
        self._inits: dict[str, bytes] = {}  # session -> its init segment (ftyp + moov)
        self._url, self._api_key = url or default_url(), api_key  # (watch: the same server and key)
        try:
            self._client: WorldClient = self._run(WorldClient.connect(url, api_key=api_key,
                                                                      reply_timeout_s=reply_timeout_s,
                                                                      queue_timeout_s=queue_timeout_s))
        except BaseException:
            self._stop()
            raise

    @property
    def config(self) -> CameraServerConfig:
        """The server's handshake (model, sizes, limits)."""
        return self._client.config

    def _run(self, coro: Coroutine[Any, Any, T], timeout_s: Optional[float] = None) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout_s)

    def _chunk(self, reply: FrameReply) -> Chunk:
        video = bytes(reply.video)
        if video[4:8] == b"ftyp":
            self._inits[reply.session_id] = split_init(video)[0]
            return Chunk(video, reply)
        if reply.session_id not in self._inits:
            raise BadReply(f"chunk {reply.chunk_id} of {reply.session_id!r} came before the session's init "
                           "segment (its chunk 0)")
        return Chunk(video, reply, self._inits[reply.session_id])

    def infer(self, session_id: str, poses: np.ndarray, intrinsics: np.ndarray, *,
              start: Optional[SessionStart] = None, prompt_update: Optional[str] = None,
              timeout_s: Optional[float] = None) -> Chunk:
        """The session's next chunk from its cameras (poses [12, 4, 4], intrinsics [12, 4]; the
        first chunk 9 frames' worth, see `camera.plan_session`); `start` on its first."""
        return self._chunk(self._run(self._client.infer(session_id, poses, intrinsics, start=start,
                                                        prompt_update=prompt_update, timeout_s=timeout_s)))

    def step(self, session_id: str, keys: Iterable[str], *, start: Optional[SessionStart] = None,
             timeout_s: Optional[float] = None) -> Chunk:
        """The session's next chunk with `keys` held (`control`, then a `from_keys` infer: the
        server moves the camera); `start` on its first. `chunk.reply.poses`: the poses used."""
        async def go() -> FrameReply:
            await self._client.control(session_id, list(keys))
            return await self._client.infer_keys(session_id, start=start, timeout_s=timeout_s)
        return self._chunk(self._run(go()))

    def stream(self, session_id: str, poses: np.ndarray, intrinsics: np.ndarray, start: SessionStart, *,
               frames: Optional[int] = None, pipeline: int = 2) -> Video:
        """A whole trajectory (poses [N, 4, 4], intrinsics [N, 4]) as one session, planned as the
        offline run (`camera.plan_session`: `frames` rounded down to whole chunks), up to
        `pipeline` requests in flight. `start.num_frames` and `translation_scale` come from the plan."""
        plan = plan_session(np.asarray(poses), np.asarray(intrinsics), frames if frames is not None else len(poses))
        messages = [encode(r) for r in plan_requests(plan, session_id, start)]
        video = Video()
        self._run(self._client.stream(messages, pipeline=pipeline,
                                      on_chunk=lambda _stat, reply: video.chunks.append(self._chunk(reply))))
        return video

    def fork(self, session_id: str, new_session_id: str, at_chunk: int) -> Forked:
        """A second session from `session_id`'s first `at_chunk` chunks (between chunks)."""
        forked = self._run(self._client.fork(session_id, new_session_id, at_chunk))
        if session_id in self._inits:
            self._inits[new_session_id] = self._inits[session_id]
        return forked

    def rewind(self, session_id: str, to_chunk: int) -> Rewound:
        """Take the session back: its next infer produces `to_chunk` again."""
        return self._run(self._client.rewind(session_id, to_chunk))

    def save(self, session_id: str, title: str = "") -> Saved:
        """Save the session as a world of its own on the server: `saved.world_id` (open it later,
        from any connection of the same API key, or address without auth)."""
        return self._run(self._client.save(session_id, title))

    def open(self, world_id: str, session_id: str) -> Opened:
        """Open a saved world as session `session_id`: its next `infer` / `step` (no `start`)
        produces chunk `opened.next_chunk_id`, decoded with the world's init segment."""
        opened = self._run(self._client.open(world_id, session_id))
        if opened.init_segment is not None:
            self._inits[session_id] = opened.init_segment
        return opened

    def share(self, session_id: str, audience: str = "link") -> Shared:
        """Share the session as a world others watch: `shared.world_id` and `shared.watch_token`
        (give both to `watch`, or the link `<server>/w/<world_id>#token=<watch_token>`, the web
        page's). `audience`: `link` (whoever holds the token) or `principal` (this API key only)."""
        return self._run(self._client.share(session_id, audience))

    def unshare(self, session_id: str) -> Unshared:
        """End the share: the token opens nothing any more, the viewers get `ended`."""
        return self._run(self._client.unshare(session_id))

    def watch(self, link: str, token: Optional[str] = None, *, api_key: Optional[str] = None,
              idle_timeout_s: Optional[float] = None) -> SyncWatch:
        """Watch a shared world on a viewer socket of its own (this client's server and key by
        default): `link` a world id (with `token`), a share link or a watch URL
        (client/watching.py `watch_target`). Runs on this client's loop: read it between this
        client's own calls."""
        target = watch_target(link, token, self._url)
        key = api_key if api_key is not None else self._api_key
        return SyncWatch(self._run(Watcher.open(target, key, idle_timeout_s=idle_timeout_s)), self._run)
    def reopen(self, world_id: str, session_id: str, *,
               timeout_s: Optional[float] = None) -> tuple[Reopened, list[Chunk]]:
        """Run a saved world's inputs (image, prompts, cameras by chunk) again through the
        served model as the new session `session_id`, for a world `open` refuses as
        `world_changed`: the `reopened` answer and its chunks (new ones, from chunk 0; not
        byte-identical where the model setup changed). The session then goes on as any other.
        `timeout_s`: the longest wait for each reply (None: the client's reply timeout)."""
        async def go() -> tuple[Reopened, list[FrameReply]]:
            reopened = await self._client.reopen(world_id, session_id)
            replies = []
            while len(replies) < reopened.chunks:
                reply = await self._client.receive(timeout_s)
                if isinstance(reply, ErrorReply) and not reply.is_notice:
                    raise ServerError.from_reply(reply)
                if isinstance(reply, FrameReply):
                    replies.append(reply)
            return reopened, replies
        reopened, replies = self._run(go())
        return reopened, [self._chunk(r) for r in replies]

    def reset(self, session_id: str) -> ResetOk:
        """End the session on the server."""
        self._inits.pop(session_id, None)
        return self._run(self._client.reset(session_id))

    def resume(self, session_id: str, resume_token: str, resume_from: Optional[int] = None, *,
               init: Optional[bytes] = None, timeout_s: Optional[float] = 60.0) -> tuple[ResumeOk, list[Chunk]]:
        """Continue a session whose socket dropped (its chunk 0 reply's `resume_token`, the frame
        replies already had): the `resumed` answer and the chunks the server sent again first.
        `init`: the session's init segment, when this client did not receive its chunk 0;
        `timeout_s`: the longest wait for each of the replies."""
        if init is not None:
            self._inits[session_id] = init

        async def go() -> tuple[ResumeOk, list[FrameReply]]:
            await self._client.send(encode(validated(ResumeRequest, {"session_id": session_id, "resume_token": resume_token,
                                                                      "resume_from": resume_from})))
            replayed = []
            while True:
                reply = await self._client.receive(timeout_s)
                if isinstance(reply, ErrorReply):
                    raise ServerError.from_reply(reply)
                if isinstance(reply, ResumeOk):
                    return reply, replayed
                if isinstance(reply, FrameReply):
                    replayed.append(reply)
        ok, replies = self._run(go())
        return ok, [self._chunk(r) for r in replies]

    def drive(self, session_id: str, start: SessionStart) -> None:
        """Open a session the server runs by itself from the keys held (`control`); read its
        chunks with `next_chunk` (acked as they are read)."""
        self._run(self._client.drive(session_id, start))

    def control(self, session_id: str, keys: Sequence[str]) -> int:
        """Set the keys held (the whole state; `[]` releases all); the event id sent."""
        return self._run(self._client.control(session_id, list(keys)))

    def next_chunk(self, timeout_s: Optional[float] = None) -> Chunk | Paused:
        """The next reply of a driven session: a chunk, or `Paused` when no key is held."""
        reply = self._run(self._client.receive(timeout_s))
        if isinstance(reply, ErrorReply):
            raise ServerError.from_reply(reply)
        if isinstance(reply, Paused):
            return reply
        if not isinstance(reply, FrameReply):
            raise BadReply(f"expected a frame or `paused`, got `{reply.type}`")
        return self._chunk(reply)

    def close(self) -> None:
        try:
            self._run(self._client.close(), timeout_s=10)
        finally:
            self._stop()

    def _stop(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
        self._loop.close()

    def __enter__(self) -> SyncWorldClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class SyncWatch:
    """A viewer of a shared world for synchronous code (client/watching.py `Watcher`): iterate it
    for `Chunk`s (`frames` decoded with the world's init segment) and `WorldNotice`s, until the
    world ends (`ended`, the last); `with` or `close()` leaves it."""

    def __init__(self, watcher: Watcher, run: Callable[[Coroutine[Any, Any, Any]], Any],
                 on_close: Optional[Callable[[], None]] = None) -> None:
        self._watcher = watcher
        self._run = run
        self._on_close = on_close
        self._init = b""

    @property
    def watching(self) -> Watching:
        return self._watcher.watching

    @property
    def viewers(self) -> int:
        return self._watcher.viewers

    @property
    def ended(self) -> Optional[WorldNotice]:
        return self._watcher.ended

    def __iter__(self) -> SyncWatch:
        return self

    def __next__(self) -> Chunk | WorldNotice:
        reply = self._run(self._watcher.next())
        if reply is None:
            raise StopIteration
        if isinstance(reply, WorldNotice):
            return reply
        video = bytes(reply.video)
        if video[4:8] == b"ftyp":
            self._init = split_init(video)[0]
            return Chunk(video, reply)
        if not self._init:
            raise BadReply("a frame came before the world's init segment")
        return Chunk(video, reply, self._init)

    def close(self) -> None:
        try:
            self._run(self._watcher.close())
        finally:
            if self._on_close is not None:
                self._on_close()

    def __enter__(self) -> SyncWatch:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def watch(link: str, token: Optional[str] = None, api_key: Optional[str] = None, *, server: Optional[str] = None,
          idle_timeout_s: Optional[float] = None) -> SyncWatch:
    """Watch a shared world without a camera connection of one's own (`watch_target` reads
    `link`): a `SyncWatch` on an event loop of its own thread (closed with it)."""
    target = watch_target(link, token, server)
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, name="lwf-watch-loop", daemon=True)
    thread.start()

    def run(coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, loop).result()

    def stop() -> None:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=10)
        loop.close()

    try:
        watcher = run(Watcher.open(target, api_key, idle_timeout_s=idle_timeout_s))
    except BaseException:
        stop()
        raise
    return SyncWatch(watcher, run, stop)
