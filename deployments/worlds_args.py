"""`worlds`: the world store (deployments/worlds/, docs/WORLDS.md).

Kept beside deployments/config.py, which nests it in `AppArgs`. Credentials are never in the
config: the S3 backend reads them from the environment variables it names.
"""
from __future__ import annotations

from typing import Literal, Optional

from pydantic import BaseModel, ConfigDict, Field, model_validator

DEFAULT_ROOT = "lwf-data/worlds"  # relative to the working directory of the process that opens the store


class WorldsArgs(BaseModel):
    """Where worlds are kept and what one principal may keep. `local`: files under `root`;
    `s3`: objects under `prefix` in `bucket` at `endpoint` (AWS when null). `enabled`: the
    ingress keeps each WebSocket session's world there, written behind the stream, and a resume
    token the parking no longer knows finds its session there (deployments/ingress/worlds/)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    # Off by default in code (a test's or an embedding's app writes nothing to disk unasked); the
    # shipped serve configs turn it on.
    enabled: bool = False
    backend: Literal["local", "s3"] = "local"
    root: str = DEFAULT_ROOT
    endpoint: Optional[str] = None  # e.g. http://seaweedfs:8333, http://minio:9000; null: AWS S3
    bucket: Optional[str] = None
    prefix: str = "worlds"
    region: str = "us-east-1"
    access_key_env: str = "AWS_ACCESS_KEY_ID"  # names of the environment variables, not the secrets
    secret_key_env: str = "AWS_SECRET_ACCESS_KEY"
    timeout_s: float = Field(10.0, gt=0)  # a request to the store; past it the store counts as down
    # Bytes one principal's worlds may take in the store (None: no limit); a write beyond is refused.
    quota_mib: Optional[float] = Field(None, gt=0)
    # A world not updated for this long is deleted by the store's sweep (None: kept until deleted).
    retention_days: Optional[float] = Field(None, gt=0)
    # How often each ingress replica sweeps the store for worlds past `retention_days` (jittered
    # +-20 %: deployments/ingress/worlds/retention.py); unused without a retention.
    sweep_period_s: float = Field(3600.0, gt=0)
    max_import_mib: float = Field(1024.0, gt=0)  # the largest `.lwf` file an import reads
    # Chunks waiting for the store (write-behind, per ingress replica); beyond it a chunk is not
    # queued and its world is marked behind (the session's journal still holds it).
    writer_queue: int = Field(256, ge=1)
    # The DiT and VAE replicas keep their torch.compile artefacts in the store
    # (deployments/worlds/compile_artifacts.py): a replica whose local compile cache is empty
    # (a fresh node) loads them before compiling; one that compiled puts them there after its
    # warm-up. False: only the local compile cache (`model.compile_cache_dir`).
    compile_artifacts: bool = False
    compile_artifact_max_mib: float = Field(512.0, gt=0)  # one artefact's bound: a larger one is neither put nor read

    @model_validator(mode="after")
    def _s3_needs_a_bucket(self) -> "WorldsArgs":
        if self.backend == "s3" and not self.bucket:
            raise ValueError("worlds.backend s3 needs worlds.bucket")
        return self
