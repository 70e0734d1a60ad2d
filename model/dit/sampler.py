"""The 4-step flow-matching sampler of one chunk and its noise plan (spec B.2, B.6, B.7).

Schedule: `s = linspace(0.999, 0, 1001)[:-1]` shifted by `shift·s / (1 + (shift − 1)·s)`,
`timesteps = int64(1000·s)` (truncated, so values repeat), `sigmas = float32(s ++ [0])`.
The reference looks sigmas up by timestep value in two ways: the x0 conversion takes the
FIRST match, the re-noise (`add_noise`) the SECOND one when the timestep is duplicated.
Per step: `x0 = x − σ_first(t)·v` (float64), then `x = (1 − σ_second(t'))·x0 + σ_second(t')·noise`
for the next timestep t'; after the 4 steps one more DiT call at t = 0 on the clean x0
writes the chunk's K/V for later chunks (its output is discarded).
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from camera.frames import CHUNK_LATENT_FRAMES

TIMESTEPS_INDEX = (0, 179, 358, 679)
SIGMA_MAX = float(np.float32(0.999))  # the scheduler's sigma_max is a float32 value
DiTCall = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]  # (x, t) -> velocity


class FlowSchedule:
    """The reference's shifted flow-matching schedule with its sigma lookups."""

    def __init__(self, shift: float = 10.0, num_train_timesteps: int = 1000) -> None:
        s = np.linspace(SIGMA_MAX, 0.0, num_train_timesteps + 1).copy()[:-1]
        s = shift * s / (1 + (shift - 1) * s)
        self.shift = shift
        self.timesteps = torch.from_numpy(s * num_train_timesteps).to(torch.int64)  # [1000]
        self.sigmas = torch.from_numpy(np.concatenate([s, [0.0]]).astype(np.float32))  # [1001]
        values = self.sigmas.tolist()
        self._first: dict[int, float] = {}
        self._second: dict[int, float] = {}
        for i, t in enumerate(self.timesteps.tolist()):
            if t not in self._first:
                self._first[t] = values[i]
            elif t not in self._second:
                self._second[t] = values[i]

    def denoise_timesteps(self, index: Sequence[int] = TIMESTEPS_INDEX) -> tuple[int, ...]:
        return tuple(int(self.timesteps[i]) for i in index)

    def sigma_x0(self, t: int) -> float:
        """Sigma of the x0 conversion: the first index whose timestep is nearest to t."""
        if t in self._first:
            return self._first[t]
        return float(self.sigmas[int((self.timesteps - t).abs().argmin())])

    def sigma_noise(self, t: int) -> float:
        """Sigma of the re-noise: the second occurrence of t when it repeats, else the first."""
        if t not in self._first:
            raise ValueError(f"timestep {t} is not in the schedule")
        return self._second.get(t, self._first[t])

    @staticmethod
    def to_x0(x: torch.Tensor, v: torch.Tensor, sigma: float) -> torch.Tensor:
        """x0 = x − sigma·v computed in float64, returned as float32."""
        return (x.double() - sigma * v.double()).float()

    @staticmethod
    def renoise(x0: torch.Tensor, noise: torch.Tensor, sigma: float) -> torch.Tensor:
        """(1 − sigma)·x0 + sigma·noise in float32 (the scheduler's add_noise)."""
        return (1.0 - sigma) * x0 + sigma * noise


DENOISE_TIMESTEPS = FlowSchedule(10.0).denoise_timesteps()  # (999, 978, 947, 825)


@dataclass(frozen=True, slots=True)
class NoiseState:
    """A restorable position of a NoisePlan (for session recovery)."""

    rng: torch.Tensor
    whole_drawn: bool


class NoisePlan:
    """The session's noise: a CPU generator seeded with `seed`, draws in the reference's order.

    With `total_latent_frames` known (offline plan) the first draw is the whole video's
    noise randn(16, lat_f, lat_h, lat_w), sliced per chunk; without it each chunk draws
    randn(16, 3, lat_h, lat_w) right before its steps. Re-noise draws (3 per chunk, after
    steps 0, 1, 2) come from the same generator. Results are moved to `device`.
    """

    def __init__(
        self,
        seed: int,
        lat_shape: tuple[int, int, int],
        total_latent_frames: int | None = None,
        device: torch.device | str = "cpu",
    ) -> None:
        if total_latent_frames is not None and (
            total_latent_frames <= 0 or total_latent_frames % CHUNK_LATENT_FRAMES
        ):
            raise ValueError(
                f"total_latent_frames must be a positive multiple of {CHUNK_LATENT_FRAMES}, "
                f"got {total_latent_frames}"
            )
        self.seed = seed
        self.channels, self.lat_h, self.lat_w = lat_shape
        self.total_latent_frames = total_latent_frames
        self.device = torch.device(device)
        self.generator = torch.Generator(device="cpu").manual_seed(seed)
        self._whole: torch.Tensor | None = None

    def _draw(self, frames: int) -> torch.Tensor:
        shape = (self.channels, frames, self.lat_h, self.lat_w)
        return torch.randn(shape, generator=self.generator, dtype=torch.float32)

    def initial(self, chunk_index: int) -> torch.Tensor:
        """The initial noise of chunk `chunk_index`, [16, 3, lat_h, lat_w].

        Call it in chunk order, right before the chunk's steps (a streaming plan draws here).
        """
        if self.total_latent_frames is None:
            return self._draw(CHUNK_LATENT_FRAMES).to(self.device)
        if not 0 <= chunk_index < self.total_latent_frames // CHUNK_LATENT_FRAMES:
            raise ValueError(
                f"chunk {chunk_index} is beyond the planned {self.total_latent_frames} latent frames"
            )
        if self._whole is None:
            self._whole = self._draw(self.total_latent_frames).to(self.device)
        lo = chunk_index * CHUNK_LATENT_FRAMES
        return self._whole[:, lo : lo + CHUNK_LATENT_FRAMES]

    def renoise_draw(self) -> torch.Tensor:
        """One re-noise draw, [16, 3, lat_h, lat_w]."""
        return self._draw(CHUNK_LATENT_FRAMES).to(self.device)

    def state(self) -> NoiseState:
        return NoiseState(self.generator.get_state(), self._whole is not None)

    def mark(self) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The position now, cheap to take and to go back to within a session (`rewind`):
        a chunk given up before its end (preempted) leaves the draws where they were."""
        return self.generator.get_state(), self._whole

    def rewind(self, mark: tuple[torch.Tensor, torch.Tensor | None]) -> None:
        self.generator.set_state(mark[0])
        self._whole = mark[1]

    def clone(self) -> "NoisePlan":
        """An independent plan at this one's position: the generator's state copied, the
        whole-video draw (when drawn) copied on its device."""
        copy = NoisePlan(self.seed, (self.channels, self.lat_h, self.lat_w), self.total_latent_frames, self.device)
        copy.generator.set_state(self.generator.get_state())
        copy._whole = None if self._whole is None else self._whole.clone()
        return copy

    def set_state(self, state: NoiseState) -> None:
        """Restore a position taken by `state()` (the whole-video noise is redrawn from the seed)."""
        self._whole = None
        if state.whole_drawn:
            self.generator.manual_seed(self.seed)
            self.initial(0)
        self.generator.set_state(state.rng)


def timestep_tensor(t: int | float, device: torch.device | str) -> torch.Tensor:
    """The DiT's t: int64 [1] for denoising steps, float32 [1] for the t = 0 cache update
    (filled on the device: no host-to-device copy, so no synchronisation)."""
    dtype = torch.int64 if isinstance(t, int) else torch.float32
    return torch.full((1,), t, dtype=dtype, device=device)


def denoise_step(
    schedule: FlowSchedule,
    plan: NoisePlan,
    x: torch.Tensor,
    v: torch.Tensor,
    k: int,
    timesteps: Sequence[int] = DENOISE_TIMESTEPS,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """After step k's velocity v at x: returns (x0, the next step's x or None after the last)."""
    x0 = schedule.to_x0(x, v, schedule.sigma_x0(timesteps[k]))
    if k + 1 == len(timesteps):
        return x0, None
    return x0, schedule.renoise(x0, plan.renoise_draw(), schedule.sigma_noise(timesteps[k + 1]))


def run_chunk(
    dit_call: DiTCall,
    x_noise: torch.Tensor,
    schedule: FlowSchedule,
    plan: NoisePlan,
    timesteps: Sequence[int] = DENOISE_TIMESTEPS,
    update: bool = True,
) -> torch.Tensor:
    """Denoise one chunk from its initial noise and write its clean K/V: returns x0.

    `dit_call(x, t)` runs the DiT with the chunk's conditioning and caches bound.
    `update=False` leaves out the t = 0 cache-update call (for a chunk whose K/V are never
    read: the last one of a planned session); x0 is the same.
    """
    x = x0 = x_noise
    for k, t in enumerate(timesteps):
        v = dit_call(x, timestep_tensor(int(t), x.device))
        x0, x_next = denoise_step(schedule, plan, x, v, k, timesteps)
        if x_next is not None:
            x = x_next
    if update:
        dit_call(x0, timestep_tensor(0.0, x0.device))  # cache update; output discarded
    return x0
