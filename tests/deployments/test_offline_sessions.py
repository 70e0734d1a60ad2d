"""Issue 46: a `/v1/videos` job's sessions are offline end to end: the runner's LocalTransport
says so, the Connection builds `SessionOptions.offline` from it, and the DiT and VAE replicas
get it with every admission; a WebSocket's sessions stay live."""
from __future__ import annotations

import asyncio

from deployments.config import AppArgs
from deployments.ingress.connection import Backends, Connection
from deployments.ingress.videos.runner import SessionRunner
from deployments.wire import SessionOptions
from protocol.codec import encode, validated
from protocol.limits import Limits
from protocol.messages import CameraServerConfig, InferRequest
from connection_fakes import FakeDeployment, FakeMetrics, FakeSocket


class OptionsSeen(FakeDeployment):
    """A fake deployment that records the `SessionOptions` each call carries."""

    def __init__(self, name: str, log: list[str]) -> None:
        super().__init__(name, log, 0.005)
        self.seen: list[tuple[str, SessionOptions]] = []

    async def call(self, method: str, args: tuple):
        self.seen += [(method, a) for a in args if isinstance(a, SessionOptions)]
        return await super().call(method, args)


def infers(example, chunks: int) -> list[bytes]:
    frames = []
    for k in range(chunks):
        poses, intrinsics = example.chunk(k)
        extra = {"image": example.image, "prompt": "p", "num_frames": 9 + 12 * (chunks - 1)} if k == 0 else {}
        frames.append(encode(validated(InferRequest, {"session_id": "s", "client_chunk_id": k, **extra,
                                                      "cameras": {"poses": poses, "intrinsics": intrinsics}})))
    return frames


def fakes() -> tuple[Backends, OptionsSeen, OptionsSeen]:
    log: list[str] = []
    dit, vae = OptionsSeen("dit", log), OptionsSeen("vae", log)
    return Backends(text=FakeDeployment("text", log, 0.005), vae=vae, dit=dit), dit, vae


def test_a_videos_job_opens_offline_sessions_on_both_replicas(example):
    backends, dit, vae = fakes()

    async def serve(transport, key_id) -> None:
        await Connection(transport, backends, AppArgs(), Limits(), CameraServerConfig(model="tiny"),
                         FakeMetrics()).run()

    video = asyncio.run(asyncio.wait_for(SessionRunner(serve, pipeline=2, busy_timeout_s=5.0).run(infers(example, 2)),
                                         30))
    assert video
    assert [m for m, _ in dit.seen] == ["reserve", "open"] and [m for m, _ in vae.seen] == ["open"]
    assert all(options.offline for _, options in dit.seen + vae.seen)


def test_a_websocket_session_is_live(example):
    backends, dit, vae = fakes()
    ws = FakeSocket(infers(example, 3))

    async def go() -> None:
        conn = Connection(ws, backends, AppArgs(), Limits(), CameraServerConfig(model="tiny"), FakeMetrics())
        await asyncio.wait_for(conn.run(), 30)

    asyncio.run(go())
    assert dit.seen and vae.seen
    assert not any(options.offline for _, options in dit.seen + vae.seen)
