"""Sessions that hold a served app's DiT slots (the waiting-room tests of the CLI and the page)."""
from __future__ import annotations

import numpy as np

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
