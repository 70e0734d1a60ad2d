"""The model replicas' constructors as the GPU configs run them (warm-up on), here on the CPU
with the tiny model at one small size bucket and without Ray: each warms up on its one model
thread, and the session calls after it run on that same thread (deployments/replicas/compute_thread.py:
cuDNN's autotuned plans and cuBLAS state are per thread)."""
from __future__ import annotations

import asyncio
import threading
import types

import numpy as np
import pytest

from deployments.replicas import dit as dit_module
from deployments.replicas import session_host
from deployments.replicas import text_encoder as text_module
from deployments.replicas import vae as vae_module
from deployments.config import ModelArgs, SessionArgs
from deployments.wire import ChunkStep, SessionOptions


def _options(resolution: tuple[int, int]) -> SessionOptions:
    return SessionOptions(session_id="s", prompt="a cat", image_digest="d", resolution=resolution, seed=1,
                          total_latent_frames=None, translation_scale=None, intrinsics_resolution=resolution)


MODEL = ModelArgs(preset="tiny", device="cpu", warmup=True, size_buckets=["32*48"], default_size="32*48")


@pytest.fixture
def threads(monkeypatch):
    """Where each warm-up ran: {name: thread ident}; outside Ray, a replica context stub."""
    seen: dict[str, int] = {}
    ctx = types.SimpleNamespace(replica_id=types.SimpleNamespace(unique_id="test-replica"))
    monkeypatch.setattr(session_host.serve, "get_replica_context", lambda: ctx)
    for module, name in ((vae_module, "warm_up_vae"), (dit_module, "warm_up_dit"), (text_module, "warm_up_text")):
        real = getattr(module, name)

        def traced(*args, _real=real, _name=name, **kwargs):
            seen[_name] = threading.get_ident()
            return _real(*args, **kwargs)

        monkeypatch.setattr(module, name, traced)
    return seen


def _instance(deployment):
    cls = deployment.func_or_class
    return cls.__new__(cls)


def test_vae_replica_warms_up_and_serves_on_one_thread(threads):
    async def go():
        vae = _instance(vae_module.VaeDeployment)
        await vae.__init__(MODEL, SessionArgs(), 4)
        calls: list[int] = []
        engine = vae._engine
        for name in ("condition", "decode"):
            real = getattr(engine, name)
            setattr(engine, name, lambda *a, _real=real: (calls.append(threading.get_ident()), _real(*a))[1])
        await vae.open("s", _options((32, 48)), np.full((40, 60, 3), 100, np.uint8))
        y = await vae.condition("s")
        out = await vae.decode("s", np.zeros((16, 3, 4, 6), np.float32))
        stats = await vae.stats()
        await vae.close("s")
        return y, out, calls, stats

    y, out, calls, stats = asyncio.run(go())
    assert y.shape == (20, 3, 4, 6) and out["num_frames"] == 9 and out["video"]
    assert stats["warmed_sizes"] == [[32, 48]]
    assert len(calls) == 2 and set(calls) == {threads["warm_up_vae"]} != {threading.get_ident()}


def test_dit_and_text_replicas_warm_up_on_their_model_thread(threads):
    async def go():
        dit = _instance(dit_module.DiTDeployment)
        await dit.__init__(MODEL, SessionArgs())
        text = text_module.TextEncoderDeployment.func_or_class(MODEL)
        step_thread: list[int] = []
        real = dit._engine.step
        dit._engine.step = lambda *a, **k: (step_thread.append(threading.get_ident()), real(*a, **k))[1]
        emb = await text.encode("a cat")
        await dit.open("s", SessionOptions(session_id="s", prompt="a cat", image_digest="d", resolution=(32, 48),
                                           seed=1, total_latent_frames=6, translation_scale=None,
                                           intrinsics_resolution=(32, 48)), emb)
        poses = np.tile(np.eye(4, dtype=np.float32), (12, 1, 1))
        await dit.step("s", ChunkStep(np.zeros((20, 3, 4, 6), np.float32), poses, np.array([[40, 40, 24, 16.0]], np.float32)))
        return dit, text, step_thread

    dit, text, step_thread = asyncio.run(go())
    assert dit._replica_info["warmed_sizes"] == [[32, 48]]
    assert step_thread == [threads["warm_up_dit"]] and threads["warm_up_dit"] != threading.get_ident()
    assert threads["warm_up_text"] != threading.get_ident()


def test_each_replica_reports_its_ready_split(threads, tmp_path, monkeypatch):
    """`ready` in each replica's stats (/v1/models): the phases of its constructor (load, warm-up,
    compile-cache save) within its total, the warm-up per size, when it started and ended, and
    the compile cache it used (the config's directory, made with its three parts)."""
    for var in ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR"):
        monkeypatch.delenv(var, raising=False)  # CompileCache.open sets them for this process
    model = MODEL.model_copy(update={"compile_cache_dir": str(tmp_path / "cc")})

    async def go():
        dit = _instance(dit_module.DiTDeployment)
        await dit.__init__(model, SessionArgs())
        vae = _instance(vae_module.VaeDeployment)
        await vae.__init__(model, SessionArgs(), 4)
        text = text_module.TextEncoderDeployment.func_or_class(model)
        return await dit.stats(), await vae.stats(), await text.stats()

    for name, stats in zip(("dit", "vae", "text"), asyncio.run(go())):
        ready = stats["ready"]
        phases = ("load", "warmup", "cache_save") if name != "text" else ("load", "warmup")
        assert all(ready[f"{p}_s"] >= 0 for p in phases), (name, ready)
        assert sum(ready[f"{p}_s"] for p in phases) <= ready["total_s"] + 1e-3, (name, ready)
        assert ready["ready_at"] - ready["started_at"] == pytest.approx(ready["total_s"], abs=2e-3)
        if name != "text":
            (entry,) = ready["warmup_per_size"]
            assert entry["size"] == [32, 48] and 0 < entry["seconds"] <= ready["warmup_s"] + 1e-3, (name, ready)
            assert ready["compile_cache"]["dir"] == str(tmp_path / "cc") and not ready["compile_cache"]["errors"]
    assert sorted(p.name for p in (tmp_path / "cc").iterdir()) == ["inductor", "mega", "triton"]


def test_warmup_sizes_first_warms_the_first_size_only_and_serves_the_others(threads):
    """`model.warmup_sizes: first`: the constructor warms the first serving size (sooner ready);
    a session of another size is served (it compiles that size on its first calls)."""
    two = ModelArgs(preset="tiny", device="cpu", warmup=True, warmup_sizes="first", size_buckets=["32*48", "48*32"],
                    default_size="32*48")

    async def go():
        vae = _instance(vae_module.VaeDeployment)
        await vae.__init__(two, SessionArgs(), 4)
        warmed = (await vae.stats())["warmed_sizes"]
        await vae.open("s", _options((48, 32)), np.full((60, 40, 3), 100, np.uint8))
        await vae.condition("s")
        out = await vae.decode("s", np.zeros((16, 3, 6, 4), np.float32))
        await vae.close("s")
        return warmed, out

    warmed, out = asyncio.run(go())
    assert warmed == [[32, 48]] and out["num_frames"] == 9 and out["video"]
    assert two.model_copy(update={"warmup_sizes": "all"}).warmed_sizes() == [(32, 48), (48, 32)]
    assert two.model_copy(update={"warmup": False}).warmed_sizes() == []
