"""PrefixReuse: one connection's use of the prefix store (store.py, keys.py).

A session the store may serve starts without replica state: its first infer opens nothing.
Each chunk is looked up (at dispatch, in request order) under the session's namespace and the
keys of its chunks so far. While chunk k is stored, its reply is sent again (`cached: true`, the
video byte for byte) and its journal entry joins the session's journal, as if the session had
computed it: no text encoder, VAE or DiT call. The first chunk that is not stored materialises
the session on the replicas, queued on the lanes ahead of that chunk's calls (rebuild.py, per
lane): from the snapshot of the session that computed the last stored chunk, where the replicas
still keep it (`prefix_cache.snapshot_mib`; its ids are stored with the chunk: `clone`, one
device copy), else by the journal's replay, as a rebuild after a lost replica does
(`VaeDeployment.restore`: the image encoded and k decodes muxed again; `DiTDeployment.reserve`,
then `restore`: one cache update per chunk, the noise generator put where it was); chunk 0 not
stored opens the session as usual. Its chunks are then computed and written to the store (every
chunk a session computes is, unless it sent `prefix_cache: false`).

Admission: a session served from the store holds no replica slot until it is materialised; its
first computed chunk may then be answered `busy` / `too_large` like a new session's first. The
API key's session and chunk quotas count it from its first infer, as any session.
"""
from __future__ import annotations

import asyncio
import time
import weakref
from collections.abc import Awaitable, Callable
from typing import Optional

from pydantic import BaseModel

from deployments.ingress.guards.connection_caps import UNKNOWN_CLIENT
from deployments.ingress.lanes import ReplicaLanes
from deployments.ingress.prefix.keys import PrefixCursor, chunk_key, namespace
from deployments.ingress.prefix.store import PrefixStore, StoredChunk
from deployments.ingress.history.rebuild import Rebuild
from deployments.ingress.stream import Stream
from protocol.messages import CameraServerConfig, FrameReply, InferRequest

STAGES = ("text_encode", "vae_encode", "dit", "vae_decode", "mux")


class PrefixReuse:
    """Looks chunks up, serves the stored ones, materialises and records the others."""

    def __init__(self, replicas: ReplicaLanes, store: Optional[PrefixStore], fingerprint: str, scope: str,
                 handshake: CameraServerConfig, metrics=None,
                 token: Callable[[Stream], Optional[str]] = lambda stream: None) -> None:
        """`store` None: the server keeps no prefix store. `scope`: whose entries this
        connection shares (its principal, or "global"). `metrics`: a `PrefixMetrics`. `token`: a
        stream's resume token, which its chunk-0 reply carries (resume.py)."""
        self._store = store
        self._fingerprint = fingerprint
        self._scope = scope
        self._dit_lane = replicas.dit_lane
        self._vae_lane = replicas.vae_lane
        self._debug_fields = replicas.args.debug_fields
        self._rebuild = Rebuild(replicas)
        self._fps = handshake.fps
        self._log = replicas.log
        self._metrics = metrics
        self._token = token
        # a session's path through the store (none: it neither reads nor writes it); only this part writes it
        self._cursors: weakref.WeakKeyDictionary[Stream, PrefixCursor] = weakref.WeakKeyDictionary()

    def attach(self, stream: Stream, req: InferRequest) -> bool:
        """A new session: True when it uses the store (then no replica holds it until its first
        chunk that is not stored); False: it neither reads nor writes it."""
        if self._store is None or req.prefix_cache is False:
            return False
        self._cursors[stream] = PrefixCursor(namespace(self._fingerprint, stream.spec, self._scope))
        stream.served_from_store()
        return True

    def forked(self, new: Stream, source: Stream, k: int) -> None:
        """`new` is `source` after k chunks (branching.py): it writes its chunks from there."""
        cursor = self._cursors.get(source)
        if cursor is not None:
            self._cursors[new] = cursor.truncated(k)

    def rewound(self, stream: Stream, k: int) -> None:
        """`stream` was taken back to k chunks (branching.py)."""
        cursor = self._cursors.get(stream)
        if cursor is not None:
            self._cursors[stream] = cursor.truncated(k)

    def key(self, stream: Stream, poses, intrinsics, prompt_update: Optional[str]) -> Optional[str]:
        """The key of the stream's next chunk (None: the stream does not use the store)."""
        if stream not in self._cursors:
            return None
        return chunk_key(poses, intrinsics, prompt_update)

    def find(self, stream: Stream, key: Optional[str]) -> Optional[StoredChunk]:
        """The stored chunk the stream's next chunk is, while it has been served from the store
        and its journal can take it (a session the journal's replay could not rebuild is never
        served)."""
        cursor = self._cursors.get(stream)
        if key is None or cursor is None or not cursor.serving or self._store is None:
            return None
        ns = cursor.namespace
        context = self._store.context(ns)
        hit = self._store.get(ns, [*cursor.keys, key])
        if hit is None or context is None:
            return None
        extra = hit.journal_bytes + (context.nbytes if not cursor.keys else 0)
        return hit if stream.journal.would_keep(extra) else None

    def serve(self, stream: Stream, key: str, hit: StoredChunk, chunk_id: int, prompt_update: Optional[str],
              client_chunk_id: Optional[int], reset: bool, t0: float) -> Awaitable[BaseModel]:
        """Chunk `chunk_id` from the store: journaled as if computed; its reply, ready."""
        cursor = self._cursors.get(stream)
        assert cursor is not None and self._store is not None
        j = stream.journal
        if chunk_id == 0:
            j.set_context(self._store.context(cursor.namespace))
        if prompt_update is not None:
            stream.steer(chunk_id, prompt_update)
        p = hit.past
        j.add_chunk(p.poses, p.intrinsics, p.y, p.latents, hit.noise, p.context, p.kv_growth)
        if hit.snapshots is not None:  # (stored only where the replicas keep snapshots)
            j.inherit_snapshot(chunk_id + 1, hit.snapshots)
        j.conditioned += 1
        j.decoded += 1
        cursor.keys.append(key)
        if self._metrics is not None:
            self._metrics.count_hit()
        durations = {stage: 0.0 for stage in STAGES}
        durations["total"] = time.perf_counter() - t0
        durations["queue_wait"] = 0.0
        debug = None
        if self._debug_fields:
            debug = {"dit_replica": None, "vae_replica": None, "recoveries": j.recoveries}
        reply = FrameReply(
            session_id=stream.spec.session_id, chunk_id=chunk_id, video=hit.video, num_frames=hit.num_frames,
            resolution=stream.spec.resolution, fps=self._fps, stage_durations=durations,
            client_chunk_id=client_chunk_id, reset=reset, mime_type=hit.mime_type, debug=debug,
            resume_token=self._token(stream) if chunk_id == 0 else None, cached=True)
        return _ready(reply)

    def computing(self, stream: Stream, key: Optional[str], open_new: Callable[[Stream], None]) -> None:
        """The stream's next chunk is computed: the stream is materialised first when the store
        served it so far (`open_new` opens one that has no chunk yet)."""
        cursor = self._cursors.get(stream)
        if not stream.materialised:
            self._materialise(stream, open_new)
        if cursor is not None and key is not None:
            cursor.serving = False
            cursor.keys.append(key)
            if self._metrics is not None:
                self._metrics.count_miss()

    async def recorded(self, stream: Stream, chunk_id: int, reply: Awaitable[BaseModel]) -> BaseModel:
        """`reply` of a computed chunk, written to the store once it is a frame."""
        out = await reply
        if isinstance(out, FrameReply):
            self._write(stream, chunk_id, out)
        return out

    def _write(self, stream: Stream, chunk_id: int, reply: FrameReply) -> None:
        cursor, j = self._cursors.get(stream), stream.journal
        if (self._store is None or cursor is None or len(cursor.keys) <= chunk_id or not j.recoverable
                or j.context is None or len(j.chunks) <= chunk_id or j.chunks[chunk_id].latents is None):
            return  # (latents None: spilled to the world store, journal_spill.py)
        snapshots = stream.snapshot_ids(chunk_id + 1) if self._rebuild.snapshots else None
        chunk = StoredChunk(reply.video, reply.num_frames, reply.mime_type, j.chunks[chunk_id], j.noises[chunk_id],
                            snapshots)
        self._store.put(cursor.namespace, cursor.keys[: chunk_id + 1], chunk, j.context)

    def _materialise(self, stream: Stream, open_new: Callable[[Stream], None]) -> None:
        """Open the stream on the replicas: as a new session without chunks, else from the
        snapshot after its last stored chunk or by the journal's replay of the chunks the store
        served (queued on the lanes now, ahead of the chunk that asked for it)."""
        k = len(stream.journal.chunks)
        if k == 0:
            open_new(stream)
            return
        # its own keys hold nothing yet: only the snapshots its stored chunks name
        dit_source, vae_source = stream.journal.snapshots.get(k, (None, None))
        paths: dict[str, str] = {}
        stream.opening(vae=self._vae_lane.submit(lambda: self._rebuild.vae(stream, vae_source, paths, k)),
                       dit=self._dit_lane.submit(lambda: self._rebuild.dit(stream, dit_source, paths)))
        both = asyncio.gather(stream.vae_open, stream.dit_open, return_exceptions=True)
        both.add_done_callback(lambda done: self._materialised(stream, k, paths, done.result()))

    def _materialised(self, stream: Stream, k: int, paths: dict[str, str], results: list) -> None:
        if any(isinstance(r, BaseException) for r in results):  # the chunk that asked for it reports it
            return
        self._log.info("session leaves the prefix store", fields={
            "session": stream.key, "chunks": k, "path": paths.get("dit"), "vae_path": paths.get("vae")})
        if self._metrics is not None:
            self._metrics.count_materialised(paths.get("dit", "replay"))


async def _ready(reply: BaseModel) -> BaseModel:
    return reply


def scope_of(scope: str, key_id: Optional[str], client: Optional[str], connection_id: str) -> str:
    """Whose entries a connection shares: everyone's ("global"), else its API key's, else its
    client address's (anonymous clients at one address share; none known: this connection only)."""
    if scope == "global":
        return "global"
    if key_id is not None:
        return f"key:{key_id}"
    return f"addr:{client}" if client and client != UNKNOWN_CLIENT else f"conn:{connection_id}"
