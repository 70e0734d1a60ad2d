"""A session's output size: the reference's rule, or the nearest of a configured set of buckets.

Without buckets the output follows spec B.1 (`camera.frames.output_size`: the `size` area and
the image's aspect), so goldens and offline runs stay exact. With buckets (the sizes a server
has compiled and warmed up) the same request maps to the bucket nearest to it in log-aspect
plus log-area: |ln(a_b / a)| + |ln(A_b / A)| with a = h0 / w0 of the image and A the area the
reference's rule would give. The image is then resized to the bucket as the reference resizes
it (stretched by the small aspect difference).

Both paths bound the work of a session's chunks: the `size` area and the output area at most
`max_output_area` (`too_large`); the image's aspect ratio is bounded from its header
(`Limits.max_aspect_ratio`, `bad_image`).
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from camera.frames import output_size
from protocol.errors import ErrorCode, ProtocolError

Size = tuple[int, int]


def nearest_bucket(buckets: Sequence[Size], target: Size, aspect: float) -> Size:
    """The bucket closest to `target` (h, w) for an image of aspect h0 / w0 = `aspect`.

    Ties go to the earlier bucket in the list."""
    if not buckets:
        raise ValueError("no size buckets to choose from")
    area = target[0] * target[1]

    def distance(b: Size) -> float:
        return abs(math.log((b[0] / b[1]) / aspect)) + abs(math.log(b[0] * b[1] / area))

    return min(buckets, key=distance)


@dataclass(frozen=True, slots=True)
class SizeRule:
    """How a session's output size is chosen and bounded (`ModelArgs` fields)."""

    buckets: tuple[Size, ...] = ()
    max_output_area: int = 1280 * 720

    def __post_init__(self) -> None:
        for h, w in self.buckets:
            if h <= 0 or w <= 0 or h % 16 or w % 16:
                raise ValueError(f"size bucket {h}x{w}: sides must be positive multiples of 16")
            if h * w > self.max_output_area:
                raise ValueError(f"size bucket {h}x{w} is over the output area cap {self.max_output_area}")

    def output(self, max_area: int, h0: int, w0: int) -> Size:
        """Output (h, w) for a `size` of area `max_area` and an h0 x w0 image; ProtocolError
        (too_large, bad_message) for a request out of bounds."""
        if max_area > self.max_output_area:
            raise ProtocolError(ErrorCode.TOO_LARGE, f"`size` area {max_area} exceeds the server's "
                                                     f"{self.max_output_area} pixels")
        try:
            h, w = output_size(max_area, h0, w0)
        except ValueError as e:
            raise ProtocolError(ErrorCode.BAD_MESSAGE, str(e)) from None
        if self.buckets:
            h, w = nearest_bucket(self.buckets, (h, w), h0 / w0)
        if h * w > self.max_output_area:  # defensive: the rule never exceeds max_area
            raise ProtocolError(ErrorCode.TOO_LARGE, f"output {h}x{w} exceeds the server's "
                                                     f"{self.max_output_area} pixels")
        return h, w
