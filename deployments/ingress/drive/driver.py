"""Driver: a session the server runs by itself (`drive`, PROTOCOL.md "Server-paced streaming").

The driver of one driven session decides when its next chunk starts; the `Connection` that
owns it queues the chunk (`StartChunk`: the same lanes, journal, quota and replies as an
infer's chunk), whose camera is bound from the keys held when its DiT job starts (binding.py).
The next chunk starts when all of these hold:

* **keys**: some key is held for the session (`control`), or it is the session's chunk 0 (the
  scene as opened). With none held the driver pauses: it puts one `paused` reply in the
  outbox (after the frame replies of the chunks already queued) and starts nothing until a
  `control` with keys wakes it;
* **one ahead**: no chunk of the session is queued whose DiT job has not started: the DiT
  always has the next chunk waiting (its VAE conditioning done meanwhile), and that chunk
  reads the keys when the DiT takes it, so the keys reach the video one chunk later at most;
* **ack window**: fewer than `max_unacked` chunks started beyond the last `ack` (chunk ids
  below `acked + max_unacked`);
* the session is open and has chunks left (its declared `num_frames`, `sessions.max_chunks`);
* **admitted**: past chunk 0, the replicas opened the session. Chunk 0 is queued at once (its
  calls wait for the admission); a session they refuse (`busy`, `too_large`) ends with chunk
  0's error: no `paused`, nothing more started (issue 43: it sent `busy`, `paused`, `busy`).

It wakes on every event that may change one of them: a control, an ack, a chunk's DiT start,
a chunk's end. `stop` cancels its task (reset, a new session, the socket's end); the chunks
already queued are the connection's, as an infer's are.
"""
from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Optional

from camera import CHUNK_LATENT_FRAMES
from deployments.errors import Busy
from deployments.ingress.lane_jobs import needs_recovery
from deployments.ingress.drive.binding import Binding
from deployments.ingress.stream import Stream, StreamState
from deployments.log import KeyValueLog
from protocol.errors import ErrorCode, ProtocolError
from protocol.messages import AckRequest, Paused

# start(stream, dit_started, binding) queues the stream's next chunk and returns its reply task;
# `dit_started` is called when the chunk's DiT job starts, which binds it in `binding`. May raise
# Busy (the key's chunk quota).
StartChunk = Callable[[Stream, Callable[[], None], Binding], asyncio.Task]


class Driver:
    """Starts a driven session's chunks (see the module doc)."""

    def __init__(self, stream: Stream, keys_held: Callable[[], bool], start: StartChunk,
                 put_paused: Callable[[Paused], None], *, sent_chunks: Callable[[], int], max_unacked: int,
                 max_chunks: int, log: KeyValueLog, opened: Optional[asyncio.Future] = None) -> None:
        """`keys_held()`: some key is held for the session now; `put_paused`: queue a `paused`
        reply in the outbox; `sent_chunks()`: the chunk replies its client was sent (resume.py);
        `opened`: the session's open on the replicas (None: open already). The ack window starts
        at the chunks the client has (0 for a new session, what a resume says for a resumed one)."""
        self._stream = stream
        self._sent_chunks = sent_chunks
        self.binding = Binding()  # its chunk the DiT runs now (binding.py)
        self._opened = opened
        self._keys_held = keys_held
        self._start = start
        self._put_paused = put_paused
        self._max_unacked = max_unacked
        self._max_chunks = max_chunks
        self._log = log
        self._acked = sent_chunks()  # chunk ids below it are acked
        self._ahead = 0  # chunks queued whose DiT job has not started
        self._paused = False  # the `paused` of the current pause was put
        self.started = 0  # chunks this driver started
        self._wake = asyncio.Event()
        self._task: Optional[asyncio.Task] = asyncio.get_running_loop().create_task(
            self._run(), name=f"drive-{stream.key}")

    @property
    def stream(self) -> Stream:
        return self._stream

    @property
    def paused(self) -> bool:
        return self._paused

    @property
    def acked(self) -> int:
        """Chunk ids below this are acked."""
        return self._acked

    def wake(self) -> None:
        """Something changed (a control): look again."""
        self._wake.set()

    def ack(self, req: AckRequest) -> None:
        """The client has the frame replies up to `req.chunk_id`; ProtocolError (nothing
        changed) for a chunk not sent yet. Acks are cumulative; an older one changes nothing."""
        sent = self._sent_chunks()
        if req.chunk_id >= sent:
            raise ProtocolError(ErrorCode.BAD_MESSAGE, f"chunk {req.chunk_id} of this session was not sent yet "
                                                       f"({sent} were); ack the chunk_id of a frame reply received")
        if req.chunk_id + 1 > self._acked:
            self._acked = req.chunk_id + 1
            self._wake.set()

    def stop(self) -> None:
        """Start no more chunks (the queued ones go on, as an infer's)."""
        if self._task is not None:
            self._task.cancel()
            self._task = None

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done()

    # ---- the loop ----

    def _finished(self) -> bool:
        s = self._stream
        total = s.spec.total_latent_frames
        return s.state is not StreamState.OPEN or s.next_chunk >= self._max_chunks or (
            total is not None and s.next_chunk >= total // CHUNK_LATENT_FRAMES)

    def _may_start(self) -> bool:
        s = self._stream
        if not (s.next_chunk == 0 or self._keys_held()):
            if not self._paused:
                self._paused = True
                self._put_paused(Paused(session_id=s.spec.session_id, next_chunk_id=s.next_chunk))
                self._log.debug("drive paused", fields={"session": s.key, "next_chunk": s.next_chunk})
            return False
        self._paused = False
        return self._ahead == 0 and s.next_chunk < self._acked + self._max_unacked

    async def _admitted(self) -> bool:
        """False when the replicas refused the session (see the module doc); waits for their
        answer once chunk 0 is queued. A failure a rebuild cures (a replica died) is no refusal:
        the chunk's step rebuilds the session (lane_jobs.py)."""
        opened = self._opened
        if opened is None or self._stream.next_chunk == 0:
            return True
        if not opened.done():
            await asyncio.wait({opened})
        if opened.cancelled():
            return False
        error = opened.exception()
        return error is None or needs_recovery(error)

    def _dit_started(self) -> None:
        self._ahead -= 1
        self._wake.set()

    async def _run(self) -> None:
        try:
            while not self._finished():
                self._wake.clear()
                if not await self._admitted():
                    return
                if not self._may_start():
                    await self._wake.wait()
                    continue
                self._ahead += 1
                try:
                    task = self._start(self._stream, self._dit_started, self.binding)
                except Busy as e:  # the API key's chunks per minute: the driver waits for its quota
                    self._ahead -= 1
                    await asyncio.sleep(e.retry_after_s)
                    continue
                self.started += 1
                task.add_done_callback(lambda _t: self._wake.set())
        except asyncio.CancelledError:
            raise
        except Exception:  # noqa: BLE001 - a bug: the session stops being driven, the socket stays
            self._log.exception("driver failed", fields={"session": self._stream.key})
