"""Typed arguments of the application builder (`build_app(args)`): the serving edge.

Every switch of the deployed graph is a field here and so visible in the serve config YAML.
"""
from __future__ import annotations

from typing import Literal, Optional

from pydantic import BaseModel, ConfigDict, Field, model_validator

from camera.frames import DEFAULT_SIZE, MAX_CHUNKS, MAX_NUM_FRAMES


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ModelArgs(_Strict):
    """What to load and how to run it."""

    preset: Literal["tiny", "lingbot-world-fast"] = "tiny"
    # Root of the released layout (the "base-cam" directory holding lingbot_world_fast/,
    # the T5 .pth, google/umt5-xxl/ and Wan2.1_VAE.pth). None with preset "tiny" serves the
    # embedded tiny default model (seeded random weights built in-process).
    checkpoint: Optional[str] = None
    dtype: Literal["float32", "bfloat16"] = "float32"  # DiT and text encoder
    vae_dtype: Literal["float32", "bfloat16"] = "float32"  # the reference runs the VAE in float32 (spec A.7)
    device: Literal["cpu", "cuda"] = "cpu"
    # Rolling KV window in latent frames (-1 = whole session) and sink frames (spec A.5).
    local_attn_size: int = Field(-1, ge=-1)
    sink_size: int = Field(0, ge=0)
    # GPU speed transforms applied from outside the model (see benchmarks/, docs/PERFORMANCE.md).
    compile: bool = False
    fp8: bool = False
    default_size: str = Field(DEFAULT_SIZE, pattern=r"^\d+\*\d+$")
    prompt_cache_size: int = Field(64, ge=0)  # text embeddings kept per TextEncoderDeployment replica (LRU)


class SessionArgs(_Strict):
    """Admission control and lifetimes of DiT sessions."""

    max_sessions: int = Field(4, ge=1)  # per DiT replica
    kv_budget_gib: Optional[float] = Field(None, gt=0)  # None: derive from free device memory
    idle_ttl_s: float = Field(300.0, gt=0)
    max_chunks: int = Field(MAX_CHUNKS, ge=1)  # 341 chunks * 3 = 1023 latent frames < RoPE table (1024)
    max_frames: int = Field(MAX_NUM_FRAMES, ge=9)  # num_frames a session may declare (4093: 341 chunks)
    retry_after_s: float = Field(5.0, gt=0)  # hint sent with `busy` when no slot is free
    max_pending_chunks: int = Field(4, ge=1)  # infers one connection may have in flight (pipelining)
    routing_stats_period_s: float = Field(2.0, gt=0)  # how often replicas report free slots to routers
    # Session recovery: the ingress journals each session (camera payloads, clean latents, y,
    # noise state; ~1.2 MB per chunk at 480p) and rebuilds it on a healthy replica when a replica
    # died or dropped it. A session whose journal outgrows journal_max_mib cannot be recovered.
    recovery: bool = True
    journal_max_mib: float = Field(512.0, gt=0)
    recovery_timeout_s: float = Field(120.0, gt=0)  # how long a rebuild waits for a replica with room


class ReplicaArgs(_Strict):
    """Placement and lifecycle of one deployment."""

    num_replicas: int = Field(1, ge=1)
    num_cpus: float = Field(0.1, ge=0)
    num_gpus: float = Field(0.0, ge=0)
    max_ongoing_requests: int = Field(16, ge=1)
    health_check_period_s: float = Field(10.0, gt=0)
    health_check_timeout_s: float = Field(30.0, gt=0)
    # A replica being replaced (upgrade, scale-down) finishes the calls in flight for this long.
    graceful_shutdown_timeout_s: float = Field(30.0, ge=0)


class ConnectionArgs(_Strict):
    """Per-WebSocket limits against abusive or broken clients (violations close the socket, 1008)."""

    max_messages_per_s: float = Field(50.0, gt=0)  # sustained client frames per second
    message_burst: int = Field(200, ge=1)  # frames allowed at once above the sustained rate
    first_message_timeout_s: float = Field(30.0, gt=0)  # accept -> first complete frame
    idle_timeout_s: float = Field(600.0, gt=0)  # no frame while no chunk is in flight
    max_unsent_replies: int = Field(64, ge=1)  # replies queued for a client that does not read them


class AuthArgs(_Strict):
    """Optional API keys; the keys themselves come from an environment variable (a secret)."""

    api_keys_env: Optional[str] = None  # e.g. "LWF_API_KEYS" (comma separated); None = auth off
    allowed_origins: list[str] = Field(default_factory=list)  # empty = any origin
    # Quotas per API key, counted per ingress replica (None: unlimited; they need api_keys_env).
    chunks_per_minute: Optional[int] = Field(None, ge=1)
    max_sessions_per_key: Optional[int] = Field(None, ge=1)

    @model_validator(mode="after")
    def _quotas_need_keys(self) -> "AuthArgs":
        if self.api_keys_env is None and (self.chunks_per_minute or self.max_sessions_per_key):
            raise ValueError("auth.chunks_per_minute and auth.max_sessions_per_key are per API key: "
                             "set auth.api_keys_env too")
        return self


class VideoArgs(_Strict):
    """`POST /v1/videos` (a whole trajectory through the same Connection code), per ingress replica."""

    max_body_mib: float = Field(64.0, gt=0)  # request bodies over this are refused (413) as soon as they pass it
    # Async jobs held: queued, running, or finished with their result (the oldest finished one
    # makes room); beyond it a new job is refused with `busy` (503 + Retry-After).
    max_jobs: int = Field(8, ge=1)
    job_ttl_s: float = Field(3600.0, gt=0)  # a finished job's result is dropped after this
    busy_timeout_s: float = Field(300.0, ge=0)  # how long a video waits out `busy` (no session slot) before 503


class AppArgs(_Strict):
    """Arguments of `deployments.app:build_app` (the `args:` block of serve_config.yaml)."""

    model: ModelArgs = ModelArgs()
    sessions: SessionArgs = SessionArgs()
    dit: ReplicaArgs = ReplicaArgs()
    vae: ReplicaArgs = ReplicaArgs()
    text_encoder: ReplicaArgs = ReplicaArgs()
    ingress: ReplicaArgs = ReplicaArgs(max_ongoing_requests=256)
    auth: AuthArgs = AuthArgs()
    connection: ConnectionArgs = ConnectionArgs()
    videos: VideoArgs = VideoArgs()
    max_message_bytes: int = Field(16 * 1024 * 1024, ge=1024)
    debug_fields: bool = False  # add replica ids to frame replies (tests, diagnosis)
    # GPUs of one node per DiT replica. 1: DiTDeployment on one device. N > 1: one replica spread
    # over N GPUs with Ulysses sequence parallelism (deployments/sp_dit.py, docs/PARALLEL.md);
    # N must divide the DiT's head count (40 heads: 2, 4, 5 or 8), and `dit` then gives each
    # rank's num_cpus / num_gpus (one placement-group bundle per rank).
    dit_parallel: int = Field(1, ge=1)
