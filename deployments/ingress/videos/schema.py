"""The documented body of `POST /v1/videos` (for /openapi.json; docs/VIDEOS.md).

The route does not let FastAPI parse its body: it reads it under the byte cap and parses it
with a bounded cost (request.py, json_guard.py), then checks it with the WebSocket's own codec
so that bad input gets the WebSocket's code and message. This model only describes that body;
`openapi_extra()` puts its JSON schema in the route's OpenAPI entry.
"""
from __future__ import annotations

from typing import Any, Optional

from pydantic import BaseModel, ConfigDict, Field

from camera import DEFAULT_INTRINSICS_RESOLUTION
from deployments.ingress.videos.request import DEFAULT_NUM_FRAMES


class VideoRequest(BaseModel):
    """A whole trajectory -> one MP4 (or an async job with `?async=true`)."""

    model_config = ConfigDict(title="VideoRequest", extra="ignore")

    image: str = Field(description="the first frame: base64 of a PNG or JPEG file (a `data:` URL is accepted)")
    prompt: str = Field(description="what the scene shows")
    poses: list[list[list[float]]] = Field(
        description="[N, 4, 4] camera-to-world poses of the trajectory (rigid; N >= 1, at most 4 per frame)")
    intrinsics: list[list[float]] = Field(description="[N, 4] fx, fy, cx, cy, one row per pose")
    num_frames: int = Field(DEFAULT_NUM_FRAMES, description="frames of the video, 4n+1; at most the server's "
                                                            "`videos.max_frames` (413 above it)")
    seed: Optional[int] = Field(None, ge=0, le=2**64 - 1, description="noise seed (same seed, same video)")
    size: Optional[str] = Field(None, description='max output area "H*W", e.g. "480*832" (the server default '
                                                  'if left out)')
    intrinsics_resolution: Optional[tuple[int, int]] = Field(
        None, description=f"[H, W] that `intrinsics` are expressed in (default {list(DEFAULT_INTRINSICS_RESOLUTION)})")


def openapi_extra() -> dict[str, Any]:
    """The route's `requestBody` entry: `VideoRequest`'s schema, inline (it has no sub-models)."""
    return {"requestBody": {"required": True, "content": {"application/json": {
        "schema": VideoRequest.model_json_schema()}}}}
