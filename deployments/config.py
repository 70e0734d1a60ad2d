"""Typed arguments of the application builder (`build_app(args)`): the serving edge.

Every switch of the deployed graph is a field here and so visible in the serve config YAML.
"""
from __future__ import annotations

import re
from typing import Literal, Optional

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from camera.frames import DEFAULT_SIZE, MAX_CHUNKS, MAX_NUM_FRAMES, output_size
from deployments.auth_args import AuthArgs
from deployments.resume_args import ResumeArgs, moved_resume_keys
from deployments.worlds_args import WorldsArgs
from deployments.share_args import SharingArgs

SIZE_PATTERN = r"^\d+\*\d+$"
REFERENCE_ASPECT = (9, 16)  # the handshake's image_resolution is for a 16:9 image
PROXY_MAX_FRAME_BYTES = 16 * 1024 * 1024  # uvicorn's ws_max_size in Serve's proxy (not configurable)
DEFAULT_MAX_MESSAGE_BYTES = 12 * 1024 * 1024  # below it: frames in between get a typed too_large


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ModelArgs(_Strict):
    """What to load and how to run it."""

    preset: Literal["tiny", "lingbot-world-fast"] = "tiny"
    # Root of the released layout (the "base-cam" directory holding lingbot_world_fast/,
    # the T5 .pth, google/umt5-xxl/ and Wan2.1_VAE.pth). None with preset "tiny" serves the
    # embedded tiny default model (seeded random weights built in-process).
    checkpoint: Optional[str] = None
    # Load tests only: the preset's dims with seeded random weights drawn on the device (the
    # benchmark's residual-scaled DiT init), no files. Its videos are noise; every replica logs
    # it as NOT A REAL MODEL and /v1/models reports it. Needs checkpoint: null.
    random_weights: bool = False
    dtype: Literal["float32", "bfloat16"] = "float32"  # DiT and text encoder
    vae_dtype: Literal["float32", "bfloat16"] = "float32"  # the reference runs the VAE in float32 (spec A.7)
    device: Literal["cpu", "cuda"] = "cpu"
    # Rolling KV window in latent frames (-1 = whole session) and sink frames (spec A.5).
    local_attn_size: int = Field(-1, ge=-1)
    sink_size: int = Field(0, ge=0)
    # GPU speed transforms applied from outside the model (see benchmarks/, docs/PERFORMANCE.md).
    # On CUDA the DiT always runs the fast block with cuDNN attention and the VAE channels-last
    # convolutions; `compile` adds the DiT's compiled elementwise regions, `vae_compile` the VAE's
    # compiled RMSNorm + SiLU; `fp8` (opt-in) FP8 GEMMs in the DiT (numerics: docs/PERFORMANCE.md).
    compile: bool = False
    vae_compile: bool = False
    fp8: bool = False
    # Opt-in: the DiT's self-attention as cuDNN's fused FP8 SDPA (Q, K, V per tensor in e4m3;
    # CUDA sm_90 with the nvidia-cudnn-frontend package). With `fp8` its e4m3 output feeds the
    # FP8 output projection. 81 frames 7.33 s against 8.31 (FP8 GEMMs), deviation from bf16
    # 5.1e-2 against 1.0e-2 (docs/PERFORMANCE.md, session 5). Its cache holds the e4m3 codes it
    # reads (session 6: half the cache bytes, windowed FP8 chunk 1.222 -> 1.166 s).
    fp8_attention: bool = False
    # The DiT's attention kernels on CUDA: cuDNN's through torch SDPA, or "fa4": FlashAttention's
    # CuTe DSL kernels (the `fa4` extra: flash-attn-4 with NVIDIA's CUTLASS DSL and its CUDA 13
    # libraries; measured on torch 2.11+cu130): exact bf16 attention, 81 frames 10.83 -> 10.27 s,
    # windowed chunk 1.75 -> 1.65-1.68 s (docs/PERFORMANCE.md, session 7); "fa3": FlashAttention-3's
    # forward kernels (the `fa3` extra: fa3-fwd, CUDA 13 torch, sm_90), with fp8_attention FA3's FP8
    # self-attention too (else, and with fa4, cuDNN's); "auto": fa3 where it runs, else cudnn.
    attention: Literal["cudnn", "fa4", "fa3", "auto"] = "cudnn"
    # Storage of the sessions' self-attention KV caches: the compute dtype (exact), or "fp8"
    # (opt-in): float8 e4m3 with a scale per token and head, ~half the bytes of a bf16 cache, so
    # about twice the full-attention sessions per replica; changed numerics (docs/PERFORMANCE.md).
    kv_cache: Literal["dtype", "fp8"] = "dtype"
    default_size: str = Field(DEFAULT_SIZE, pattern=SIZE_PATTERN)
    # Output sizes "H*W" (multiples of 16) the server produces: a session's `size` and image
    # aspect map to the nearest (docs/SERVING.md, Sizes); all are warmed up. Empty: the
    # reference's rule (max area + the image's aspect), which the goldens follow.
    size_buckets: list[str] = Field(default_factory=list)
    # Bounds of a session's size: the `size` area and the output area (a chunk's VAE and x264
    # work is proportional to it), and the image's aspect ratio (long side / short side).
    max_output_area: int = Field(1280 * 720, ge=256)
    max_aspect_ratio: float = Field(4.0, ge=1.0)
    # Compile, autotune and run every size (the buckets, else default_size for a 16:9 image)
    # once in each replica's constructor, before Serve routes traffic to it.
    warmup: bool = True
    # Which sizes the warm-up runs: `all`, or the `first` only (a replica ready sooner: on the
    # H100 a VAE size is 11-15 s of a warm start; a session of another size then compiles it on
    # its first calls, once per replica, and the calls queued behind them wait).
    warmup_sizes: Literal["all", "first"] = "all"
    # A directory where each replica keeps what torch.compile builds (inductor's and Triton's
    # caches, and torch's mega-cache file per deployment: model/compile_cache.py): the first start
    # fills it, later starts and replicas added by the autoscaler load it instead of compiling
    # again. Shared by the replicas of a node (k8s: a volume mounted there). None: torch's
    # per-user default under /tmp, lost with the container.
    compile_cache_dir: Optional[str] = None
    prompt_cache_size: int = Field(64, ge=0)  # text embeddings kept per TextEncoderDeployment replica (LRU)
    # The text encoder's weights: in `dtype` (exact), or "int8" (opt-in): its matrices as int8 with
    # a scale per 128 weights, dequantized one at a time per call (model/text_int8.py): UMT5-XXL
    # 10.6 -> 5.5 GiB, the room an 80 GB card needs for a VAE session beside the bf16 DiT; the
    # context moves ~2x as far from float32 as bf16's own rounding (docs/PERFORMANCE.md).
    text_weights: Literal["dtype", "int8"] = "dtype"

    @field_validator("size_buckets")
    @classmethod
    def _buckets(cls, v: list[str]) -> list[str]:
        for size in v:
            if not re.fullmatch(SIZE_PATTERN, size):
                raise ValueError(f"size bucket {size!r} must look like '464*832' (H*W)")
            h, w = (int(x) for x in size.split("*"))
            if h % 16 or w % 16 or min(h, w) < 16:
                raise ValueError(f"size bucket {size!r}: H and W must be positive multiples of 16")
        if len(set(v)) != len(v):
            raise ValueError(f"size_buckets has duplicates: {v}")
        return v

    @model_validator(mode="after")
    def _weights(self) -> "ModelArgs":
        if self.random_weights and self.checkpoint is not None:
            raise ValueError("model.random_weights builds random weights: set model.checkpoint to null")
        if self.checkpoint is None and not self.random_weights and self.preset != "tiny":
            raise ValueError(f"preset {self.preset!r} needs model.checkpoint (or model.random_weights "
                             "for load tests); only 'tiny' is embedded")
        if self.fp8_attention and self.device != "cuda":
            raise ValueError("model.fp8_attention runs an FP8 attention kernel: it needs device: cuda")
        if self.attention not in ("cudnn", "auto") and self.device != "cuda":
            raise ValueError(f"model.attention {self.attention!r} runs GPU kernels: it needs device: cuda")
        dh, dw = (int(x) for x in self.default_size.split("*"))
        if dh * dw > self.max_output_area:
            raise ValueError(f"model.default_size {self.default_size} is over model.max_output_area "
                             f"({self.max_output_area})")
        for size in self.size_buckets:
            h, w = (int(x) for x in size.split("*"))
            if h * w > self.max_output_area:
                raise ValueError(f"size bucket {size} is over model.max_output_area ({self.max_output_area})")
        return self

    def bucket_sizes(self) -> list[tuple[int, int]]:
        """`size_buckets` as (H, W) pairs."""
        return [tuple(int(x) for x in s.split("*")) for s in self.size_buckets]  # type: ignore[misc]

    def weights_are_random(self) -> bool:
        """Seeded random weights: `random_weights`, or the embedded tiny model (no checkpoint)."""
        return self.random_weights or self.checkpoint is None

    def warmed_sizes(self) -> list[tuple[int, int]]:
        """The sizes a replica warms up before it is ready (none without `warmup`)."""
        if not self.warmup:
            return []
        sizes = self.serving_sizes()
        return sizes[:1] if self.warmup_sizes == "first" else sizes

    def serving_sizes(self) -> list[tuple[int, int]]:
        """The output sizes replicas warm up: the buckets, else default_size for a 16:9 image
        (what the handshake announces as image_resolution)."""
        if self.size_buckets:
            return self.bucket_sizes()
        h, w = (int(x) for x in self.default_size.split("*"))
        return [output_size(h * w, *REFERENCE_ASPECT)]


class SessionArgs(_Strict):
    """Admission control and lifetimes of DiT sessions."""

    max_sessions: int = Field(4, ge=1)  # per DiT replica
    # Bytes a DiT replica's sessions may hold (KV + cross caches, noise plan, text, plus one
    # chunk's camera features and activations). None: the replica's memory cap
    # (memory_fraction of the device) minus what it holds after loading and warming up.
    kv_budget_gib: Optional[float] = Field(None, gt=0)
    # Share of the device a DiT replica's process may allocate (torch's per-process cap on
    # CUDA). None: on CUDA the replica's `num_gpus` (the shares of the deployments on one card
    # then also split its memory), on the CPU 0.25 of the RAM.
    memory_fraction: Optional[float] = Field(None, gt=0, le=1)
    # Bytes a VAE replica's sessions may hold (both causal caches, the image, plus one call's
    # activations, model/vae/footprint.py). None: on CUDA the replica's cap (its `num_gpus`
    # share) minus what it holds after warm-up; on the CPU no byte budget (slots only).
    vae_budget_gib: Optional[float] = Field(None, gt=0)
    # Work bound per chunk: the most tokens one chunk's self-attention may attend to (tokens per
    # latent frame x the latent frames the session's cache holds: its window, else its declared
    # or grown length). Beyond it: too_large.
    max_attention_tokens: int = Field(131072, ge=1)
    idle_ttl_s: float = Field(300.0, gt=0)
    max_chunks: int = Field(MAX_CHUNKS, ge=1)  # 341 chunks * 3 = 1023 latent frames < RoPE table (1024)
    max_frames: int = Field(MAX_NUM_FRAMES, ge=9)  # num_frames a session may declare (4093: 341 chunks)
    retry_after_s: float = Field(5.0, gt=0)  # hint sent with `busy` when no slot is free
    max_pending_chunks: int = Field(4, ge=1)  # infers one connection may have in flight (pipelining)
    # Sessions one connection holds besides its current one, made by `fork` (branching.py);
    # each counts against admission and the key's session quota like any session.
    max_branches: int = Field(4, ge=0)
    routing_stats_period_s: float = Field(2.0, gt=0)  # how often replicas report free slots to routers
    # Session recovery: the ingress journals each session (camera payloads, clean latents, y,
    # noise state; ~1.2 MB per chunk at 480p) and rebuilds it on a healthy replica when a replica
    # died or dropped it. A session whose journal outgrows journal_max_mib cannot be recovered.
    recovery: bool = True
    journal_max_mib: float = Field(512.0, gt=0)
    recovery_timeout_s: float = Field(120.0, gt=0)  # how long a rebuild waits for a replica with room
    # Resume after a dropped socket: grace period, the parking's bounds (deployments/resume_args.py)
    resume: ResumeArgs = ResumeArgs()
    # Sessions one VAE replica holds. None: 2 x max_sessions x the DiT's most replicas (every
    # session, and briefly a second incarnation of each, fits one VAE replica). Set it, with
    # `vae.autoscaling`, to scale the VAE by the sessions its replicas hold.
    vae_max_sessions: Optional[int] = Field(None, ge=1)
    # People, not slots (docs/SERVING.md "Waiting room"): a live session is admitted only while
    # every live session of the DiT replica keeps min_fps frames/s (0: slots and bytes only); one
    # that cannot be admitted waits in the application's one line (at most max_waiting; 0: `busy`
    # at once, as before). `/v1/videos` jobs hold at most max_offline_sessions sessions per DiT
    # replica, beside max_sessions live ones, and run in the live sessions' gaps.
    min_fps: float = Field(0.0, ge=0)
    max_waiting: int = Field(16, ge=0)
    max_waiting_per_principal: int = Field(2, ge=1)  # places one API key (address without auth) holds in line
    # While anyone waits, a seat idle this long (no chunk asked for; a paused drive) yields: its
    # session is parked and rejoins the line on its next chunk; max_turn_s (None: off) of streaming too.
    yield_idle_s: float = Field(20.0, gt=0)
    max_turn_s: Optional[float] = Field(None, gt=0)
    max_offline_sessions: int = Field(1, ge=1)

    @model_validator(mode="before")
    @classmethod
    def _resume_keys_moved(cls, data: object) -> object:
        moved_resume_keys(data)
        return data


class AutoscalingArgs(_Strict):
    """Serve autoscaling of a stateful deployment (DiT, VAE) by the sessions its replicas hold
    (deployments/autoscaling_policy.py; docs/RELIABILITY.md, Autoscaling)."""

    min_replicas: int = Field(1, ge=1)
    max_replicas: int = Field(2, ge=1)
    # Replicas wanted: the held sessions' load (share of slots or budget bytes per replica)
    # over target_fill; and one more as soon as admission answers `busy`.
    target_fill: float = Field(1.0, gt=0, le=1)
    upscale_delay_s: float = Field(0.0, ge=0)  # a new replica takes a while to start already
    # A scale-down moves the sessions of the replica Serve removes by journal replay (the
    # ingress rebuilds them on the others); wait this long for the load to stay low first.
    downscale_delay_s: float = Field(300.0, ge=0)
    look_back_period_s: float = Field(10.0, gt=0)  # the load is the window's maximum
    metrics_interval_s: float = Field(2.0, gt=0)  # how often replicas report it to the controller

    @model_validator(mode="after")
    def _bounds(self) -> "AutoscalingArgs":
        if self.max_replicas < self.min_replicas:
            raise ValueError(f"autoscaling.max_replicas ({self.max_replicas}) is below min_replicas "
                             f"({self.min_replicas})")
        return self


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
    # Placement on a multi-node cluster: Ray node labels the replicas must land on (e.g.
    # {"lwf-pool": "dit"}: the KubeRay worker groups' labels, `ray start --labels`) and custom
    # resources each replica takes (e.g. {"gpu_slot": 0.5}). Empty: anywhere.
    label_selector: dict[str, str] = Field(default_factory=dict)
    resources: dict[str, float] = Field(default_factory=dict)
    # DiT and VAE only: autoscale between min and max replicas by held sessions (num_replicas
    # is then unused). None: num_replicas, fixed.
    autoscaling: Optional[AutoscalingArgs] = None

    @property
    def most_replicas(self) -> int:
        """The most replicas this deployment runs at once (max_replicas when autoscaled)."""
        return self.autoscaling.max_replicas if self.autoscaling else self.num_replicas


class ConnectionArgs(_Strict):
    """Per-WebSocket limits against abusive or broken clients (violations close the socket, 1008)."""

    max_messages_per_s: float = Field(50.0, gt=0)  # sustained client frames per second
    message_burst: int = Field(200, ge=1)  # frames allowed at once above the sustained rate
    # accept -> first complete frame: a socket that sends nothing holds a connection slot until
    # then (64 idle sockets kept every new client at `server_full` for 30 s).
    first_message_timeout_s: float = Field(5.0, gt=0)
    # No infer (resets do not count) and no reply for this long while no chunk is in flight.
    idle_timeout_s: float = Field(300.0, gt=0)
    max_unsent_replies: int = Field(64, ge=1)  # replies queued for a client that does not read them
    # When a socket ends, the call in flight on each lane may finish for this long (it is never
    # cancelled) before the sessions are closed on the replicas; bounds a handler's life too.
    release_timeout_s: float = Field(30.0, gt=0)
    # Bytes a socket may send: `max_bytes_per_s` sustained with bursts of `bytes_burst` (None:
    # 2 x max_message_bytes, room for two largest frames at once). Beyond it the socket is
    # closed (1008): a flood of large frames cannot fill the proxy's or the ingress's memory.
    max_bytes_per_s: float = Field(1024 * 1024, gt=0)
    bytes_burst: Optional[int] = Field(None, ge=1024)
    max_refused_frames: int = Field(8, ge=1)  # frames answered too_large/bad_message in a row -> close
    # WebSockets one ingress replica holds: None = ingress.max_ongoing_requests - 8, which keeps
    # room for /healthz, /v1/models and the offline endpoint (each open socket is one ongoing
    # request for its whole life). Beyond a cap the socket gets `busy` and is closed (1013).
    max_connections: Optional[int] = Field(None, ge=1)
    max_connections_per_client: int = Field(16, ge=1)  # per client address
    # Slots of `max_connections` that only an address holding no socket may take: a few
    # addresses with many sockets cannot lock every new client out.
    reserved_for_new_clients: int = Field(4, ge=0)
    # Take the client address from the last X-Forwarded-For entry, the one the proxy in front
    # appended (set true behind a trusted load balancer or Kubernetes ingress; never when clients
    # reach the Serve proxy directly).
    trust_forwarded_for: bool = False


class VideoArgs(_Strict):
    """`POST /v1/videos` (a whole trajectory through the same Connection code), per ingress replica."""

    max_body_mib: float = Field(64.0, gt=0)  # request bodies over this are refused (413) as soon as they pass it
    # Async jobs held: queued, running, or finished with their result (the oldest finished one
    # makes room); beyond it a new job is refused with `busy` (503 + Retry-After).
    max_jobs: int = Field(8, ge=1)
    job_ttl_s: float = Field(3600.0, gt=0)  # a finished job's result is dropped after this
    busy_timeout_s: float = Field(300.0, ge=0)  # how long a video waits out `busy` (no session slot) before 503
    # Videos (sync requests and unfinished async jobs) one principal may have at once on this
    # replica: an API key, or without auth a client address; beyond it a new one gets `busy`.
    max_jobs_per_principal: int = Field(2, ge=1)
    # The most frames one video may declare (num_frames): 481 frames is 40 chunks, ~30 s of
    # video; above it `too_large` (413). A 4089-frame job held a DiT slot ~1 h on the CPU.
    # Also bounds the poses a body may carry (4 per frame), hence the JSON it may hold.
    max_frames: int = Field(481, ge=9)


class ControlArgs(_Strict):
    """Per video frame steps of the keys held (`control`, camera/keys.py `KeySteps`); the defaults
    are the LingBot-World keyboard convention (TeleFuser's lingbot_world_fast service)."""

    move: float = Field(0.05, ge=0)  # scene units per frame, W/S
    lateral: float = Field(0.05, ge=0)  # scene units per frame, A/D and Q/E
    yaw_deg: float = Field(2.0, ge=0, le=90)  # J/L
    pitch_deg: float = Field(2.0, ge=0, le=90)  # I/K
    pitch_limit_deg: float = Field(85.0, ge=0, le=90)
    max_unacked_chunks: int = Field(2, ge=1, le=64)  # a driven session (`drive`) runs this far ahead of its `ack`s
    # A driven chunk whose keys change while the DiT runs it is given up at its next denoising
    # call and made again with the new keys (once per chunk): the change shows one chunk sooner,
    # at the cost of the calls given up (drive/binding.py).
    preempt: bool = True


class PrefixCacheArgs(_Strict):
    """Exact-prefix reuse (deployments/ingress/prefix/): finished chunks kept per ingress replica,
    served again, byte for byte, to a session whose inputs repeat a stored prefix."""

    # Bytes of stored chunks (video, latents, y, camera, noise state) per ingress replica, least
    # recently used evicted first; 0 turns the store off.
    max_mib: float = Field(0.0, ge=0)
    # Snapshots of sessions' replica state (deployments/replicas/snapshots.py): before each chunk
    # every DiT and every VAE replica keeps a device copy of the session as it is (KV caches,
    # noise and camera; VAE causal caches and muxer counters), and a closed session's final
    # state, in the spare bytes of its session budget, at most this many MiB each, least
    # recently used evicted first, and always evicted before a session is refused. A fork below
    # a session's head, a rewind, and a session leaving the prefix store then copy one (one
    # device copy) instead of replaying the journal (one cache-update call and one decode per
    # chunk). 0: none kept. Independent of `max_mib`.
    snapshot_mib: float = Field(0.0, ge=0)
    # Who may reuse whose chunks: `principal` (an API key, or without auth a client address)
    # or `global` (everyone: a hit can then be timed across clients).
    scope: Literal["principal", "global"] = "principal"

    @property
    def enabled(self) -> bool:
        return self.max_mib > 0


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
    controls: ControlArgs = ControlArgs()
    prefix_cache: PrefixCacheArgs = PrefixCacheArgs()
    worlds: WorldsArgs = WorldsArgs()  # the world store (deployments/worlds_args.py, docs/WORLDS.md)
    sharing: SharingArgs = SharingArgs()  # worlds people share (deployments/share_args.py)
    # The largest client frame. Ray 2.60's HTTP proxy closes a socket on a frame above 16 MiB
    # (1009) as soon as it reads the frame's header; a larger value could never be reached. The
    # default stays below it so that an oversized frame up to 16 MiB gets the typed `too_large`.
    max_message_bytes: int = Field(DEFAULT_MAX_MESSAGE_BYTES, ge=1024, le=PROXY_MAX_FRAME_BYTES)
    debug_fields: bool = False  # add replica ids to frame replies (tests, diagnosis)
    # CPUs each one-replica coordinator reserves in Ray: the session parking, the waiting room and
    # the world hub (asyncio actors that mostly wait), placed like the ingress (its labels and
    # resources). Each reserved the ingress's num_cpus before: with the hub, 2 + 2 + 2 more on the
    # H100 configs (18 of 16 cores, the ingress never scheduled) and 9 of serve_config.gpu.yaml's 8.
    coordinator_cpus: float = Field(0.1, ge=0)
    # GPUs of one node per DiT replica. 1: DiTDeployment on one device. N > 1: one replica spread
    # over N GPUs with Ulysses sequence parallelism (deployments/replicas/sp_dit.py, docs/PARALLEL.md);
    # N must divide the DiT's head count (40 heads: 2, 4, 5 or 8), and `dit` then gives each
    # rank's num_cpus / num_gpus (one placement-group bundle per rank).
    dit_parallel: int = Field(1, ge=1)
    # A sequence-parallel replica (dit_parallel > 1) gives a rank this long to answer (open, close,
    # ping, the end of a step) and its collectives this long to complete; past it, or at once
    # when a rank dies, the replica breaks: its sessions are rebuilt elsewhere and Serve
    # replaces it (docs/RELIABILITY.md).
    dit_parallel_timeout_s: float = Field(60.0, gt=0)

    def coordinators(self) -> int:
        """The one-replica coordinators the app runs: the session parking (resumes on), the
        waiting room (a line) and the world hub (sharing on)."""
        return (int(self.sessions.resume.grace_s > 0) + int(self.sessions.max_waiting > 0)
                + int(self.sharing.enabled))

    def cpus_at_most(self) -> float:
        """The CPUs the app's replicas reserve in Ray with every deployment at its most replicas
        (an autoscaled DiT / VAE at max_replicas; a sequence-parallel DiT replica's ranks; the
        coordinators, `coordinator_cpus` each). A box with fewer leaves a replica pending: on the
        H200 a second autoscaled DiT replica never started (4 + 4 + VAE 4 + T5 2 + ingress 2 +
        parking 2 = 18 of 16 cores)."""
        return (self.dit.num_cpus * self.dit.most_replicas * self.dit_parallel
                + self.vae.num_cpus * self.vae.most_replicas
                + self.text_encoder.num_cpus * self.text_encoder.most_replicas
                + self.ingress.num_cpus * self.ingress.most_replicas
                + self.coordinator_cpus * self.coordinators())

    @model_validator(mode="after")
    def _autoscaling_of_session_hosts_only(self) -> "AppArgs":
        for name in ("text_encoder", "ingress"):
            if getattr(self, name).autoscaling is not None:
                raise ValueError(f"{name}.autoscaling: only dit and vae autoscale (by the sessions they hold); "
                                 f"set {name}.num_replicas")
        return self

    @model_validator(mode="after")
    def _a_largest_frame_fits_the_byte_burst(self) -> "AppArgs":
        burst = self.connection.bytes_burst
        if burst is not None and burst < self.max_message_bytes:
            raise ValueError(f"connection.bytes_burst ({burst}) must be at least max_message_bytes "
                             f"({self.max_message_bytes}), or no frame of the largest size could be sent")
        return self

    @model_validator(mode="after")
    def _prefix_cache_needs_journals(self) -> "AppArgs":
        if self.prefix_cache.enabled and not self.sessions.recovery:
            raise ValueError("prefix_cache needs sessions.recovery: a session served from the store is "
                             "rebuilt on the replicas from its journal when its inputs leave the stored prefix")
        return self

    @model_validator(mode="after")
    def _fp8_kv_on_one_device(self) -> "AppArgs":
        if self.model.kv_cache == "fp8" and self.dit_parallel > 1:
            raise ValueError("model.kv_cache fp8 runs on one device per DiT replica: set dit_parallel 1 "
                             "(the sequence-parallel caches keep the compute dtype)")
        return self
