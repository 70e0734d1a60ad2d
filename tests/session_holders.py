"""Sessions that hold a served app's DiT slots (the waiting-room tests of the CLI and the page)."""
from __future__ import annotations

import numpy as np

from protocol.messages import FrameReply
from protocol.requests import SessionStart
from client.session import WorldClient
from client.trajectory import Trajectory, plan_session
from support import EXAMPLES


async def hold_sessions(url: str, n: int) -> list[WorldClient]:
    """Open n sessions (each on its own connection) and keep them."""
    traj = Trajectory.load([EXAMPLES / "00"])
    poses = plan_session(traj, 9).chunk_poses[0]
    intrinsics = np.repeat(traj.intrinsics[:1], len(poses), axis=0)
    clients = []
    for i in range(n):
        c = await WorldClient.connect(url)
        clients.append(c)
        reply = await c.infer(f"holder-{i}", poses, intrinsics, start=SessionStart(traj.image, traj.prompt),
                              timeout_s=60)
        assert reply.chunk_id == 0
    return clients


async def reference_videos(connect, sid: str, traj, chunks: int, seed: int) -> list[bytes]:
    """The uninterrupted session's chunks, at most 2 in flight (`connect`: the tests/deployments
    fixture's socket factory), reset after: the videos a resumed session is held to."""
    async with connect() as c:
        replies, sent = [], 0
        while len(replies) < chunks:
            while sent < chunks and sent - len(replies) < 2:
                await c.infer(sid, traj, sent, first=sent == 0, seed=seed)
                sent += 1
            replies.append(await c.recv())
        await c.reset(sid)
    assert all(isinstance(r, FrameReply) for r in replies), replies
    return [r.video for r in replies]
