"""Model configuration: frozen dataclasses for the DiT, T5 and VAE, and the presets table.

Dims follow the spec (A.1, C.1, C.2) and ../shared/ckpt/README.md. The DiT config.json of
the release does not carry `text_dim`, `patch`, `qk_norm`, `cross_attn_norm` (the reference
never reads them from it): `DiTConfig.from_json` takes `text_dim` from the weights' shapes.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace

from camera.frames import CHUNK_LATENT_FRAMES

CONTROL_DIMS = {"cam": 6, "act": 7}  # Plücker channels per pixel by control type (spec B.5)


@dataclass(frozen=True, slots=True)
class DiTConfig:
    """The causal camera-conditioned DiT (spec A.1)."""

    dim: int
    ffn_dim: int
    num_heads: int
    num_layers: int
    freq_dim: int = 256
    in_dim: int = 36  # 16 noisy latent + 4 mask + 16 image latent
    out_dim: int = 16
    text_dim: int = 4096
    text_len: int = 512
    patch: tuple[int, int, int] = (1, 2, 2)
    eps: float = 1e-6
    control_dim: int = 6
    local_attn_size: int = -1  # latent frames kept in the KV cache; -1 = all
    sink_size: int = 0  # latent frames of the start kept when the window rolls

    def __post_init__(self) -> None:
        assert self.dim % self.num_heads == 0, "dim must split into heads"
        assert self.head_dim % 2 == 0 and self.head_dim >= 6, "RoPE needs an even head_dim >= 6"
        assert self.freq_dim % 2 == 0, "the sinusoidal time embedding needs an even freq_dim"
        assert len(self.patch) == 3, "patch is (t, h, w)"
        assert self.in_dim == 2 * self.out_dim + 4, "in_dim = noisy latent + 4 mask + image latent"
        if self.local_attn_size != -1 and self.local_attn_size < self.sink_size + CHUNK_LATENT_FRAMES:
            raise ValueError(
                f"local_attn_size ({self.local_attn_size}) must hold the sink ({self.sink_size}) "
                f"plus one chunk of {CHUNK_LATENT_FRAMES} latent frames, or be -1 (no window)"
            )
        if self.sink_size < 0:
            raise ValueError(f"sink_size must be >= 0, got {self.sink_size}")

    @property
    def head_dim(self) -> int:
        return self.dim // self.num_heads

    @property
    def patch_features(self) -> int:
        """Features of one output patch of the head (= 64 for patch (1, 2, 2))."""
        return self.patch[0] * self.patch[1] * self.patch[2] * self.out_dim

    def with_window(self, local_attn_size: int | None = None, sink_size: int | None = None) -> "DiTConfig":
        """A copy with the KV window overridden (None keeps the current value)."""
        return replace(
            self,
            local_attn_size=self.local_attn_size if local_attn_size is None else local_attn_size,
            sink_size=self.sink_size if sink_size is None else sink_size,
        )

    @classmethod
    def from_json(
        cls,
        config: dict,
        text_dim: int,
        local_attn_size: int | None = None,
        sink_size: int | None = None,
    ) -> "DiTConfig":
        """Build from a released `config.json` dict; `text_dim` comes from the weights."""
        missing = [k for k in ("dim", "ffn_dim", "num_heads", "num_layers") if k not in config]
        if missing:
            raise ValueError(f"DiT config.json lacks {', '.join(missing)}")
        control_type = config.get("control_type", "cam")
        if control_type not in CONTROL_DIMS:
            raise ValueError(f"unknown control_type {control_type!r}; expected one of {list(CONTROL_DIMS)}")
        cfg = cls(
            dim=int(config["dim"]),
            ffn_dim=int(config["ffn_dim"]),
            num_heads=int(config["num_heads"]),
            num_layers=int(config["num_layers"]),
            freq_dim=int(config.get("freq_dim", 256)),
            in_dim=int(config.get("in_dim", 36)),
            out_dim=int(config.get("out_dim", 16)),
            text_dim=int(text_dim),
            text_len=int(config.get("text_len", 512)),
            eps=float(config.get("eps", 1e-6)),
            control_dim=CONTROL_DIMS[control_type],
            local_attn_size=int(config.get("local_attn_size", -1)),
            sink_size=int(config.get("sink_size", 0)),
        )
        return cfg.with_window(local_attn_size, sink_size)


@dataclass(frozen=True, slots=True)
class T5Config:
    """The UMT5 encoder (spec C.1)."""

    vocab: int
    dim: int
    dim_attn: int
    dim_ffn: int
    num_heads: int
    num_layers: int
    num_buckets: int = 32

    def __post_init__(self) -> None:
        assert self.dim_attn % self.num_heads == 0, "dim_attn must split into heads"


@dataclass(frozen=True, slots=True)
class VAEConfig:
    """The Wan 2.1 VAE (spec C.2); the rest of the architecture is fixed."""

    dim: int = 96
    z_dim: int = 16


@dataclass(frozen=True, slots=True)
class ModelConfig:
    dit: DiTConfig
    t5: T5Config
    vae: VAEConfig = field(default_factory=VAEConfig)


PRESETS: dict[str, ModelConfig] = {
    "lingbot-world-fast": ModelConfig(
        dit=DiTConfig(dim=5120, ffn_dim=13824, num_heads=40, num_layers=40),
        t5=T5Config(vocab=256384, dim=4096, dim_attn=4096, dim_ffn=10240, num_heads=64, num_layers=24),
        vae=VAEConfig(dim=96, z_dim=16),
    ),
    "tiny": ModelConfig(
        dit=DiTConfig(dim=128, ffn_dim=256, num_heads=2, num_layers=2, text_dim=64),
        t5=T5Config(vocab=512, dim=64, dim_attn=64, dim_ffn=128, num_heads=4, num_layers=2),
        vae=VAEConfig(dim=16, z_dim=16),
    ),
}


def preset(name: str) -> ModelConfig:
    """The named preset, or a ValueError listing the known names."""
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}; known: {', '.join(PRESETS)}")
    return PRESETS[name]
