"""model/warmup.py: the DiT's warm-up runs the path a served session's chunks take."""
from __future__ import annotations

import numpy as np

import camera.poses
from camera.frames import chunk_video_frames
from media.fmp4 import Fmp4Muxer
from model.factory import load_dit_engine, load_text_engine, load_vae_engine
from model.session import DiTSessionSpec
from model.warmup import warm_camera, warm_up_dit, warm_up_text, warm_up_vae


def test_the_warm_up_sends_a_served_sessions_camera():
    """9 poses for chunk 0, 12 after, moving and continuing from chunk to chunk: a still single
    pose skipped the interpolation to latent-frame poses, whose first run (scipy's import) the
    first session after a start then paid in its first chunk (0.3 s on the H200)."""
    previous_last = None
    for k in range(3):
        poses, intrinsics = warm_camera(k, 464, 832)
        assert poses.shape == (chunk_video_frames(k), 4, 4) and intrinsics.shape == (chunk_video_frames(k), 4)
        camera.poses.check_poses(poses)  # valid rigid transforms
        z = poses[:, 2, 3]
        assert np.all(np.diff(z) > 0)
        if previous_last is not None:
            assert z[0] > previous_last
        previous_last = z[-1]


def test_the_dit_warm_up_runs_the_camera_interpolation(monkeypatch):
    calls = []
    real = camera.poses.interpolate_poses

    def spy(poses, positions):
        calls.append(len(poses))
        return real(poses, positions)

    monkeypatch.setattr(camera.poses, "interpolate_poses", spy)
    engine = load_dit_engine("tiny", None, "float32", "cpu", local_attn_size=15, sink_size=3, random_weights=True)
    report = warm_up_dit(engine, [(32, 48)])
    assert report.sizes == [(32, 48)]
    assert calls == [chunk_video_frames(0), chunk_video_frames(1)]  # the two warm-up chunks, as sessions send them


def test_the_first_chunk_benchmark_reports_each_sessions_chunks(tmp_path):
    """benchmarks/probes/first_chunk.py (run on the GPU for issue 35's first TTFC), on the tiny model:
    the warm-up-like session, then the realistic ones, each chunk timed with its counters."""
    import json

    from benchmarks.probes.first_chunk import main

    out = tmp_path / "first_chunk.json"
    assert main(["--preset", "tiny", "--device", "cpu", "--dtype", "float32", "--size", "32x48", "--no-compile",
                 "--sessions", "2", "--chunks", "2", "--out", str(out)]) == 0
    r = json.loads(out.read_text())
    assert [s["inputs"] for s in r["sessions"]] == ["warm-up's", "moving camera", "moving camera"]
    for s in r["sessions"]:
        assert len(s["chunks"]) == 2 and all(c["step_s"] > 0 and isinstance(c["moved"], dict) for c in s["chunks"])
        assert all("compiled_graphs" not in c["moved"] for c in s["chunks"])  # nothing compiled after the warm-up


def first_chunks_after_the_warm_up() -> list[str]:
    """(Run in a fresh interpreter.) Each engine warmed up as its replica does, then a served
    session's first two chunks; the modules they imported."""
    import sys

    size = (32, 48)
    dit = load_dit_engine("tiny", None, "float32", "cpu", local_attn_size=15, sink_size=3, random_weights=True)
    vae = load_vae_engine("tiny", None, "float32", "cpu", random_weights=True)
    text = load_text_engine("tiny", None, "float32", "cpu")
    warm_up_dit(dit, [size])
    warm_up_vae(vae, [size], consumer=lambda hw: Fmp4Muxer(hw[1], hw[0], 16).add_chunk)
    warm_up_text(text)

    before = set(sys.modules)
    context = text.encode("a lighthouse on a cliff at dusk, waves below")
    v = vae.open(np.random.default_rng(3).integers(0, 255, (*size, 3), dtype=np.uint8), *size)
    muxer = Fmp4Muxer(size[1], size[0], 16)
    s = dit.open(DiTSessionSpec(context=context, height=size[0], width=size[1], seed=5))
    for k in range(2):
        y = vae.condition(v)
        poses, intrinsics = warm_camera(k, *size)
        poses[:, 0, 3] += 0.02 * np.arange(len(poses))  # and sideways: a camera the warm-up did not send
        out = dit.step(s, y, poses, intrinsics, defer_update=True)
        dit.finish_chunk(s)
        muxer.add_chunk(vae.decode(v, out.latents))
    dit.close(s)
    vae.close(v)
    return sorted(set(sys.modules) - before)


def test_after_the_warm_up_a_served_sessions_first_chunks_import_nothing():
    """A module first imported inside a session's chunk is a one-off the warm-up missed: the first
    session after a start pays it (scipy's interpolation cost 0.3 s of its first chunk). After
    each engine's warm-up, the calls of a real session (a prompt, an image, a moving camera, the
    fMP4 muxer) import no new module. In a fresh interpreter: in this one earlier tests have
    imported most things already."""
    import json
    import subprocess
    import sys

    from support import REPO

    script = ("import json, sys; sys.path[:0] = ['tests', 'tests/model']; "
              "from test_warmup import first_chunks_after_the_warm_up as f; print(json.dumps(f()))")
    run = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    assert json.loads(run.stdout.strip().splitlines()[-1]) == []