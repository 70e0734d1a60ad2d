"""The synchronous client against the served app: frames as arrays equal to what PyAV decodes
from the returned bytes, for a planned 33-frame session, a driven one, a fork and a rewind."""
from __future__ import annotations

import io

import av
import numpy as np
import pytest

from client.sync import SyncWorldClient
from client.synthetic import synthetic_trajectory
from protocol.errors import ProtocolError
from protocol.requests import SessionStart


def decoded(data: bytes) -> np.ndarray:
    with av.open(io.BytesIO(data), format="mp4") as container:
        return np.stack([f.to_ndarray(format="rgb24") for f in container.decode(video=0)])


def test_a_33_frame_session_streams_as_arrays(served):
    traj = synthetic_trajectory("orbit", 33)
    with SyncWorldClient(served.ws) as c:
        video = c.stream("sync-33", traj.poses, traj.intrinsics, SessionStart(traj.image, traj.prompt, seed=5),
                         frames=33)
    frames = video.frames
    assert frames.dtype == np.uint8 and frames.ndim == 4 and frames.shape[0] == 33 and frames.shape[3] == 3
    assert [c.chunk_id for c in video.chunks] == [0, 1, 2]
    assert [len(c.frames) for c in video.chunks] == [9, 12, 12]
    np.testing.assert_array_equal(frames, decoded(video.data))
    assert frames.std() > 0  # not blank


def test_a_driven_session_with_a_fork_and_a_rewind(served):
    traj = synthetic_trajectory("orbit", 9)
    start = SessionStart(traj.image, "a street", seed=3, num_frames=45, translation_scale=0.2)
    with SyncWorldClient(served.ws) as c:
        chunks = [c.step("sync-keys", ["w"], start=start), c.step("sync-keys", ["w", "j"]), c.step("sync-keys", [])]
        assert [k.chunk_id for k in chunks] == [0, 1, 2] and [len(k.frames) for k in chunks] == [9, 12, 12]
        assert chunks[1].reply.poses is not None and chunks[1].reply.event_id == 2
        whole = b"".join(k.video for k in chunks)
        np.testing.assert_array_equal(np.concatenate([k.frames for k in chunks]), decoded(whole))

        forked = c.fork("sync-keys", "sync-fork", at_chunk=2)
        assert forked.next_chunk_id == 2
        branch = c.step("sync-fork", ["w", "j"])  # a forked session decodes with its parent's init segment
        assert branch.chunk_id == 2
        np.testing.assert_array_equal(branch.frames, decoded(chunks[0].video[:chunks[0].video.index(b"moof") - 4]
                                                             + branch.video))
        assert c.rewind("sync-keys", 1).next_chunk_id == 1
        again = c.step("sync-keys", ["w", "j"])
        assert again.chunk_id == 1
        np.testing.assert_array_equal(again.frames, chunks[1].frames)  # same keys, same chunk
        assert c.reset("sync-fork").type == "reset_ok" and c.reset("sync-keys").type == "reset_ok"
        with pytest.raises(ProtocolError):  # refused before sending: the code the server would answer
            c.step("x" * 500, ["w"], start=start)
