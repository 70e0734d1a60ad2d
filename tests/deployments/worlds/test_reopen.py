"""`reopen`'s inputs (deployments/ingress/worlds/reopen.py): a stored world back as the infers of
a new session, and the `size` that gives the world's output size on this server."""
from __future__ import annotations

import numpy as np
import pytest

from deployments.ingress.sizes import SizeRule
from deployments.ingress.worlds.reopen import reopen_requests, size_for
from deployments.worlds.local import LocalStore
from deployments.worlds.worlds import Worlds
from protocol.errors import ProtocolError
from protocol.limits import DEFAULT_LIMITS, Limits
from worlds_support import OPTIONS, save


def test_a_world_becomes_one_infer_per_chunk_with_its_inputs(tmp_path):
    worlds = Worlds(LocalStore(tmp_path))
    journal, m = save(worlds)
    world = worlds.load("alice", m.world_id)
    infers = reopen_requests(world, "again", DEFAULT_LIMITS, "128*16")
    assert len(infers) == 3 and {r.session_id for r in infers} == {"again"}
    first = infers[0]
    assert np.array_equal(first.image, journal.image) and first.prompt == OPTIONS.prompt
    assert (first.seed, first.size, first.num_frames, first.translation_scale) == (OPTIONS.seed, "128*16", None, None)
    assert first.intrinsics_resolution == OPTIONS.intrinsics_resolution
    assert [r.image is None and r.prompt is None for r in infers[1:]] == [True, True]
    assert [r.prompt_update for r in infers] == [None, "the lake freezes", None]  # as journaled, by chunk
    for r, past in zip(infers, journal.chunks):
        assert np.array_equal(r.cameras.poses, past.poses) and np.array_equal(r.cameras.intrinsics, past.intrinsics)


def test_inputs_this_servers_limits_refuse_are_a_protocol_error(tmp_path):
    worlds = Worlds(LocalStore(tmp_path))
    _, m = save(worlds)
    with pytest.raises(ProtocolError):
        reopen_requests(worlds.load("alice", m.world_id), "again", Limits(max_output_area=1000), "128*16")


@pytest.mark.parametrize("resolution, image, default_area", [
    ((32, 48), (480, 832), 32 * 64),  # the server's default size gives it
    ((480, 832), (480, 832), 32 * 64),  # the resolution's own area falls just short (rounding): a little more
    ((128, 224), (480, 832), 480 * 832),
    ((464, 832), (480, 832), 1)])
def test_the_size_sent_gives_the_worlds_output_size(resolution, image, default_area):
    rule = SizeRule((), 1280 * 720)
    h, w = (int(v) for v in size_for(resolution, (*image, 3), rule, default_area).split("*"))
    assert rule.output(h * w, *image) == resolution
