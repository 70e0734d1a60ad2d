"""Limits that the codec enforces on client messages (typed settings, one place)."""
from __future__ import annotations

from dataclasses import dataclass

from camera.frames import MAX_NUM_FRAMES

MIB = 1024 * 1024


@dataclass(frozen=True, slots=True)
class Limits:
    """Bounds on what one client message may carry.

    The defaults suit the released model (480*832 output, 12-frame chunks). The server
    announces `max_message_bytes` in its config handshake.
    """

    # One WebSocket frame; checked before unpacking. Below the 16 MiB at which Ray Serve's proxy
    # closes a socket (1009) before the server reads the frame: a frame between the two gets the
    # typed `too_large` (the largest legitimate frame, an 8 MiB image + 48 poses, is ~8.1 MiB).
    max_message_bytes: int = 12 * MIB
    max_image_bytes: int = 8 * MIB  # encoded PNG/JPEG bytes of `image`
    # h*w of the image, checked before decoding (~33.5 MP: phone and camera photos; the
    # reference's example 04 is 5472x3648 = 20 MP). Decoding costs 3 bytes per pixel.
    max_image_pixels: int = 8192 * 4096
    min_image_side: int = 16  # min(h, w) of the image in pixels
    max_prompt_chars: int = 4096
    max_session_id_chars: int = 128
    max_poses_per_chunk: int = 48  # N of `cameras` (12 frames per chunk; 4 poses per frame at most)
    rotation_tolerance: float = 1e-3  # max|R^T R - I| and |det R - 1|; also |last row - (0,0,0,1)|
    # `translation_scale` divides relative translations (float32 on the server): outside this
    # range it underflows to 0 or blows the camera features up, and the video is NaN or black.
    translation_scale_range: tuple[float, float] = (1e-6, 1e6)
    max_translation: float = 1e6  # |t| of any pose, in scene units
    max_output_area: int = 1280 * 720  # H*W of the `size` session option (and of the output)
    max_aspect_ratio: float = 4.0  # long side / short side of the image, read from its header
    # `num_frames` session option; sizes the noise plan. The default is the model's bound (the
    # frames of MAX_CHUNKS chunks); the server passes its `sessions.max_frames`.
    max_num_frames: int = MAX_NUM_FRAMES
    max_map_len: int = 64  # entries of any msgpack map (messages have ~12 fields)
    # Nested-list arrays (the third wire encoding): entries of one msgpack array (an image row
    # of at most 8192 pixels) and elements of all arrays of one message together (a raw
    # 1280x720 RGB image as nested lists is 2.8 M). Binary maps (msgpack-numpy, openpi) are
    # bounded by max_message_bytes alone.
    max_array_len: int = 8192
    max_array_elements: int = 4 * MIB

    def __post_init__(self) -> None:
        for name in (
            "max_message_bytes", "max_image_bytes", "max_image_pixels", "min_image_side",
            "max_prompt_chars", "max_session_id_chars", "max_poses_per_chunk",
            "max_output_area", "max_num_frames", "max_map_len", "max_array_len", "max_array_elements",
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"Limits.{name} must be >= 1, got {getattr(self, name)}")
        if self.max_aspect_ratio < 1.0:
            raise ValueError(f"Limits.max_aspect_ratio must be >= 1, got {self.max_aspect_ratio}")
        if not 0.0 < self.rotation_tolerance < 1.0:
            raise ValueError(f"Limits.rotation_tolerance must be in (0, 1), got {self.rotation_tolerance}")


DEFAULT_LIMITS = Limits()
