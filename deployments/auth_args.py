"""`auth`: API keys, the origins allowed besides the server's own, per-key quotas.

Kept beside deployments/config.py, which nests it in `AppArgs` as `auth`.
"""
from __future__ import annotations

from typing import Optional

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from deployments.origins import canonical_origin


class AuthArgs(BaseModel):
    """Optional API keys; the keys themselves come from an environment variable (a secret)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    api_keys_env: Optional[str] = None  # e.g. "LWF_API_KEYS" (comma separated); None = auth off
    # `Origin`s allowed besides the server's own (its Host): [] = none, ["*"] = any (deployments/origins.py)
    allowed_origins: list[str] = Field(default_factory=list)
    # Quotas per API key, counted per ingress replica (None: unlimited; they need api_keys_env).
    chunks_per_minute: Optional[int] = Field(None, ge=1)
    max_sessions_per_key: Optional[int] = Field(None, ge=1)
    max_connections_per_key: int = Field(16, ge=1)  # WebSockets of one key at once (auth on)

    @field_validator("allowed_origins")
    @classmethod
    def _origins(cls, v: list[str]) -> list[str]:
        return [canonical_origin(o) for o in v]

    @model_validator(mode="after")
    def _quotas_need_keys(self) -> "AuthArgs":
        if self.api_keys_env is None and (self.chunks_per_minute or self.max_sessions_per_key):
            raise ValueError("auth.chunks_per_minute and auth.max_sessions_per_key are per API key: "
                             "set auth.api_keys_env too")
        return self
