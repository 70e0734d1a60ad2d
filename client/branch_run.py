"""The CLI's scripted exploration: after the main session, take it back (`--rewind-to K`) or
branch it (`--fork-at K`) and play chunks K, K+1, ... another way.

The branch's inputs, from chunk K on: `--branch-trajectory` (that trajectory's poses of those
chunks, planned like the main one), `--branch-keys SCRIPT` (key states, `from_keys` infers),
and/or `--branch-prompt TEXT` (a `prompt_update` on chunk K). With none of the three the branch
repeats the main session's own inputs: its chunks must then equal the main ones byte for byte
(the server's fork and rewind are exact), a quick check of a deployment.

The branch's video is the main session's first K chunks followed by the branch's chunks (one
playable MP4: the server continues the session's muxer).
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal, Optional

import numpy as np

from client.keydrive import KeyDriveLog, drive_keys
from client.session import WorldClient
from client.stats import ChunkStat
from client.streaming import StreamResult
from protocol.codec import encode
from protocol.messages import FrameReply
from protocol.requests import infer_request

OnChunk = Callable[[ChunkStat, FrameReply], None]


@dataclass(frozen=True)
class MainSession:
    """What the branch needs of the main session: its id, its received payloads, its length
    (the chunks its declared num_frames allows) and its own inputs per chunk."""

    session_id: str
    fragments: Sequence[bytes]
    chunks: int
    chunk_cameras: Optional[Sequence[tuple[np.ndarray, np.ndarray]]] = None  # (poses, intrinsics) per chunk
    chunk_keys: Optional[Sequence[tuple[str, ...]]] = None  # keys per chunk (a drive)


@dataclass(frozen=True)
class BranchSpec:
    mode: Literal["fork", "rewind"]
    at: int  # the first chunk the branch produces
    cameras: Optional[Sequence[tuple[np.ndarray, np.ndarray]]] = None  # --branch-trajectory, per chunk of the plan
    keys: Optional[Sequence[tuple[str, ...]]] = None  # --branch-keys, per branch chunk
    prompt: Optional[str] = None  # --branch-prompt

    def check(self, main_chunks: int) -> None:
        """ValueError when the branch cannot run on a main session of `main_chunks` chunks."""
        low = 1 if self.mode == "fork" else 0
        flag = "--fork-at" if self.mode == "fork" else "--rewind-to"
        if not low <= self.at < main_chunks:
            raise ValueError(f"{flag} {self.at}: must be in {low}..{main_chunks - 1} (the main session has "
                             f"{main_chunks} chunks, and the branch needs at least one to produce)")
        if self.prompt is not None and self.at == 0:
            raise ValueError("--branch-prompt steers from chunk K >= 1 on; a rewind to 0 starts over: "
                             "run a new session with --prompt instead")
        if self.keys is not None and self.cameras is not None:
            raise ValueError("--branch-keys and --branch-trajectory both give the branch's camera; pick one")
        if self.keys is not None and len(self.keys) > main_chunks - self.at:
            raise ValueError(f"--branch-keys plays {len(self.keys)} chunks but the session declared "
                             f"{main_chunks} in all: at most {main_chunks - self.at} from chunk {self.at}")
        if self.cameras is not None and len(self.cameras) < main_chunks:
            raise ValueError(f"--branch-trajectory gives {len(self.cameras)} chunks for the main session's "
                             f"{main_chunks}: it needs as many poses as the main trajectory")


async def run_branch(client: WorldClient, main: MainSession, spec: BranchSpec, *, pipeline: int = 1,
                     on_chunk: Optional[OnChunk] = None,
                     clock: Callable[[], float]) -> tuple[str, StreamResult, Optional[KeyDriveLog]]:
    """Fork or rewind the main session, then play the branch; (its session id, its result whose
    video starts with the main session's first `spec.at` chunks, the key log of a keyed branch)."""
    spec.check(main.chunks)
    if spec.mode == "fork":
        sid = f"{main.session_id}-fork{spec.at}"
        await client.fork(main.session_id, sid, spec.at)
    else:
        sid = main.session_id
        await client.rewind(sid, spec.at)
    result = StreamResult(started_at=clock())
    for payload in main.fragments[:spec.at]:
        result.video.append(payload)
    keys = spec.keys if spec.keys is not None else (
        main.chunk_keys[spec.at:] if spec.cameras is None and main.chunk_keys is not None else None)
    log = None
    if keys is not None:
        log = await drive_keys(client, sid, keys, into=result, first_chunk=spec.at, prompt_update=spec.prompt,
                               on_chunk=on_chunk, clock=clock)
    else:
        cameras = spec.cameras if spec.cameras is not None else main.chunk_cameras
        assert cameras is not None, "a main session has either cameras or keys"
        messages = [encode(infer_request(sid, *cameras[k], prompt_update=spec.prompt if k == spec.at else None))
                    for k in range(spec.at, main.chunks)]
        await client.stream(messages, pipeline=pipeline, on_chunk=on_chunk, into=result, clock=clock)
    if spec.mode == "fork":  # done: free its slot now (the main session ends with the socket, as without a branch)
        await client.reset(sid)
    return sid, result, log
