"""The handshake: what the server says about itself right after the WebSocket accept (PROTOCOL.md).

Its own module (messages.py re-exports it): the model, the video geometry, the limits and what
the server offers; pure like the rest of the package.
"""
from __future__ import annotations

from typing import Literal, Optional

from pydantic import BaseModel, ConfigDict, Field, JsonValue

from camera.frames import (CHUNK_LATENT_FRAMES, CHUNK_VIDEO_FRAMES, DEFAULT_INTRINSICS_RESOLUTION, DEFAULT_SIZE,
                           FIRST_CHUNK_VIDEO_FRAMES, FPS, MAX_CHUNKS, MAX_LATENT_FRAMES, VAE_TIME_STRIDE)
from protocol.limits import DEFAULT_LIMITS


class CameraServerConfig(BaseModel):
    """Handshake, sent by the server right after the WebSocket accept."""

    model_config = ConfigDict(frozen=True, extra="ignore")  # as the other messages (messages.py `_Message`)

    type: Literal["config"] = "config"
    model: str
    patch_size: tuple[int, int, int] = (1, 2, 2)
    chunk_latent_frames: int = CHUNK_LATENT_FRAMES
    vae_temporal_stride: int = VAE_TIME_STRIDE
    chunk_video_frames: int = CHUNK_VIDEO_FRAMES
    first_chunk_video_frames: int = FIRST_CHUNK_VIDEO_FRAMES
    image_resolution: tuple[int, int] = Field((464, 832), description="[H, W] for a 16:9 image at the default size")
    default_size: str = Field(DEFAULT_SIZE, description="the `size` (\"H*W\": an area) of a session that names "
                                                        "none; with the image's aspect it gives the output (§4)")
    intrinsics_resolution: tuple[int, int] = DEFAULT_INTRINSICS_RESOLUTION
    fps: int = FPS
    frame_dtype: Literal["uint8"] = "uint8"
    video_codec: Literal["h264"] = "h264"
    needs_session_id: bool = True
    supported_modalities: tuple[str, ...] = ("camera_pose",)
    coordinate_convention: Literal["opencv_c2w"] = "opencv_c2w"
    max_message_bytes: int = DEFAULT_LIMITS.max_message_bytes
    max_output_area: int = Field(DEFAULT_LIMITS.max_output_area,
                                 description="the largest `size` area (H*W pixels) a session may ask for "
                                             "(`too_large` beyond)")
    random_weights: bool = Field(False, description="the weights are seeded random ones (the embedded tiny model, "
                                                    "a load test's): the video is coloured noise that follows "
                                                    "the camera")
    checkpoint: Optional[str] = Field(None, description="the name of the checkpoint folder the weights come from; "
                                                        "absent with random weights")
    size_buckets: Optional[tuple[tuple[int, int], ...]] = Field(
        None, description="[[H, W], ...] the output sizes this server produces (a session's `size` and image "
                          "aspect map to the nearest); absent: the reference's rule (max area + image aspect)")
    max_chunks: int = Field(MAX_CHUNKS, description="chunks one session may produce (the `session_limit` error "
                                                    "comes with the reply before the last one)")
    max_latent_frames: int = Field(MAX_LATENT_FRAMES, description="latent frame positions of one session "
                                                                  "(the model's RoPE table)")
    window: Optional[tuple[int, int]] = Field(
        None, description="[local, sink] latent frames of the rolling KV window that sessions without "
                          "`num_frames` (or too long for full attention in the server's budget) run with, "
                          "at fixed memory; sessions that declare `num_frames` and fit run full attention; "
                          "absent: every session full attention")
    resume_grace_s: Optional[float] = Field(
        None, description="seconds a session stays resumable after its socket dropped (`resume_token`); "
                          "absent: sessions end with their socket")
    min_fps: float = Field(0.0, description="the frame-rate floor per live session: a new session is refused "
                                            "`busy` while admitting it would leave a session on its replica below "
                                            "this many frames/s (the replica's measured chunk times); 0: no floor")
    debug: Optional[dict[str, JsonValue]] = Field(None, description="server-side debug fields (replica ids, ...)")
    protocol_version: Literal[1] = 1
