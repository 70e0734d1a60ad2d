"""model/dit/sampler.py: schedule, sigma quirks, noise plan and the chunk loop against the goldens."""
from __future__ import annotations

import pytest
import torch

from model.dit.sampler import (
    DENOISE_TIMESTEPS,
    FlowSchedule,
    NoisePlan,
    denoise_step,
    run_chunk,
    timestep_tensor,
)
from support import GOLDEN_FILES, load_golden

golden_param = pytest.mark.parametrize("golden_file", GOLDEN_FILES, ids=lambda p: p.stem)


def plan_for(g: dict, offline: bool = True) -> NoisePlan:
    m = g["meta"]
    return NoisePlan(m["seed"], (16, m["lat_h"], m["lat_w"]), m["lat_f"] if offline else None)


@golden_param
def test_schedule_equals_golden(golden_file):
    g = load_golden(golden_file.name)
    s = FlowSchedule(shift=g["meta"]["shift"])
    assert s.timesteps.dtype == torch.int64 and s.sigmas.dtype == torch.float32
    assert torch.equal(s.timesteps, g["scheduler"]["timesteps"])
    assert torch.equal(s.sigmas, g["scheduler"]["sigmas"])
    assert s.denoise_timesteps(g["meta"]["timesteps_index"]) == DENOISE_TIMESTEPS


def test_denoise_timesteps():
    assert DENOISE_TIMESTEPS == (999, 978, 947, 825)
    assert FlowSchedule(shift=5.0).denoise_timesteps() == (999, 957, 899, 702)


def test_sigma_quirks_match_the_spec():
    s = FlowSchedule(10.0)
    x0_sigmas = [s.sigma_x0(t) for t in (999, 978, 947, 825)]
    noise_sigmas = [s.sigma_noise(t) for t in (978, 947, 825)]
    assert x0_sigmas == pytest.approx([0.99989992, 0.97897100, 0.94790888, 0.82585257], abs=5e-9)
    assert noise_sigmas == pytest.approx([0.97882956, 0.94769305, 0.82519257], abs=5e-9)
    ideal = [s.sigmas[i].item() for i in (0, 179, 358, 679)]
    assert ideal == pytest.approx([0.99989992, 0.97854578, 0.94704223, 0.82519257], abs=5e-9)
    # first match vs second match of a duplicated timestep
    idx = (s.timesteps == 978).nonzero().flatten().tolist()
    assert len(idx) > 1
    assert s.sigma_x0(978) == s.sigmas[idx[0]].item() and s.sigma_noise(978) == s.sigmas[idx[1]].item()
    with pytest.raises(ValueError, match="not in the schedule"):
        s.sigma_noise(1000)


@golden_param
def test_sampler_replay_is_bit_exact(golden_file):
    """Noise plan + x0 conversion + re-noise from the recorded outs reproduce every step x."""
    g = load_golden(golden_file.name)
    schedule, plan = FlowSchedule(g["meta"]["shift"]), plan_for(g)
    for c, ch in enumerate(g["chunks"]):
        x = plan.initial(c)
        for k, step in enumerate(ch["steps"]):
            assert torch.equal(x, step["x"]), (c, k)
            assert int(step["t"]) == DENOISE_TIMESTEPS[k]
            x0, x = denoise_step(schedule, plan, step["x"], step["out"], k)
        assert x is None
        assert torch.equal(x0, ch["cache_update"]["x"])
    assert torch.equal(torch.cat([ch["cache_update"]["x"] for ch in g["chunks"]], 1), g["latents"])


@golden_param
def test_run_chunk_makes_the_reference_calls(golden_file):
    """run_chunk with a DiT replaying the recorded outputs: same inputs, t dtypes, result."""
    g = load_golden(golden_file.name)
    schedule, plan = FlowSchedule(g["meta"]["shift"]), plan_for(g)
    for c, ch in enumerate(g["chunks"]):
        calls = ch["steps"] + [ch["cache_update"]]
        seen = []

        def dit_call(x, t):
            call = calls[len(seen)]
            seen.append((x.clone(), t.clone()))
            return call["out"]

        x0 = run_chunk(dit_call, plan.initial(c), schedule, plan)
        assert len(seen) == 5
        for (x, t), call in zip(seen, calls):
            assert torch.equal(x, call["x"])
            assert t.dtype == call["t"].dtype and torch.equal(t, call["t"])
        assert torch.equal(x0, ch["cache_update"]["x"])


def test_streaming_plan_draws_per_chunk():
    """Unknown length: each chunk draws randn(16, 3, h, w) right before its steps."""
    plan = NoisePlan(7, (16, 4, 6), None)
    gen = torch.Generator().manual_seed(7)
    for c in range(2):
        assert torch.equal(plan.initial(c), torch.randn(16, 3, 4, 6, generator=gen))
        for _ in range(3):
            assert torch.equal(plan.renoise_draw(), torch.randn(16, 3, 4, 6, generator=gen))


def test_offline_plan_draws_the_whole_video_first():
    plan = NoisePlan(42, (16, 4, 6), 6)
    gen = torch.Generator().manual_seed(42)
    whole = torch.randn(16, 6, 4, 6, generator=gen)
    assert torch.equal(plan.initial(0), whole[:, :3])
    assert torch.equal(plan.renoise_draw(), torch.randn(16, 3, 4, 6, generator=gen))
    assert torch.equal(plan.initial(1), whole[:, 3:])
    with pytest.raises(ValueError, match="beyond"):
        plan.initial(2)
    with pytest.raises(ValueError, match="multiple of 3"):
        NoisePlan(42, (16, 4, 6), 4)


@pytest.mark.parametrize("total", [None, 9])
def test_state_restores_the_noise_stream(total):
    plan = NoisePlan(3, (16, 2, 2), total)
    plan.initial(0)
    plan.renoise_draw()
    state = plan.state()
    expected = [plan.renoise_draw(), plan.initial(1), plan.renoise_draw()]
    recovered = NoisePlan(3, (16, 2, 2), total)  # e.g. a session rebuilt elsewhere
    recovered.set_state(state)
    assert all(torch.equal(a, b) for a, b in zip(expected, [recovered.renoise_draw(), recovered.initial(1),
                                                            recovered.renoise_draw()]))
    if total is not None:
        assert torch.equal(recovered.initial(0), plan.initial(0))


def test_to_x0_is_float64_math():
    x = torch.tensor([1.0, 2.0, 3.0])
    v = torch.tensor([0.1, 0.2, 0.3])
    sigma = FlowSchedule().sigma_x0(978)
    expected = (x.double() - torch.tensor(sigma, dtype=torch.float64) * v.double()).float()
    assert torch.equal(FlowSchedule.to_x0(x, v, sigma), expected)


def test_timestep_tensor_types_and_values():
    """int steps are int64 (the reference's timestep tensor), the cache update's t = 0.0 float32."""
    step = timestep_tensor(937, "cpu")
    update = timestep_tensor(0.0, "cpu")
    assert step.dtype == torch.int64 and step.shape == (1,) and int(step) == 937
    assert update.dtype == torch.float32 and update.shape == (1,) and float(update) == 0.0
    assert torch.equal(step, torch.tensor([937])) and torch.equal(update, torch.tensor([0.0]))
