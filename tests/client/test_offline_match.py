"""The client's session plan reproduces the offline run (`WorldPipeline.generate`) frame for frame.

Both run in this process on the embedded tiny model: the plan's chunks are stepped through a
session opened with the plan's options (what the server does with the first infer's options).
"""
from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image

from client.trajectory import Trajectory, plan_session
from support import EXAMPLES

MAX_AREA = 32 * 64
SEED = 5


@pytest.fixture(scope="module")
def pipe():
    from model.pipeline import WorldPipeline

    return WorldPipeline.load("tiny")


def streamed(pipe, traj: Trajectory, frames: int, *, with_options: bool = True) -> np.ndarray:
    from model.pipeline import SessionRequest

    plan = plan_session(traj, frames)
    image = np.asarray(Image.open(io.BytesIO(traj.image)).convert("RGB"))
    spec = SessionRequest(image, traj.prompt, SEED, MAX_AREA, plan.num_frames if with_options else None,
                       plan.translation_scale if with_options else None)
    session = pipe.open_session(spec)
    try:
        chunks = []
        for poses in plan.chunk_poses:
            out = pipe.step(session, poses, np.repeat(plan.intrinsics[None], len(poses), axis=0))
            chunks.append(pipe.decode(session, out.latents))
        return np.concatenate(chunks)
    finally:
        pipe.close(session)


@pytest.mark.parametrize("frames", [33, 41])  # 41: not whole chunks, so latent poses (N = 3) are sent
def test_plan_reproduces_the_offline_run(pipe, frames):
    traj = Trajectory.load([EXAMPLES / "01"])  # varying intrinsics: only the first row counts
    image = np.asarray(Image.open(io.BytesIO(traj.image)).convert("RGB"))
    offline, session = pipe.generate(image, traj.prompt, traj.poses, traj.intrinsics, frame_num=frames, seed=SEED,
                                     max_area=MAX_AREA)
    pipe.close(session)
    video = streamed(pipe, traj, frames)
    assert video.shape == offline.frames.shape == (33, 32, 48, 3)
    np.testing.assert_array_equal(video, offline.frames)
    if frames == 33:  # the declared options matter: without them the video differs
        assert not np.array_equal(streamed(pipe, traj, frames, with_options=False), offline.frames)
