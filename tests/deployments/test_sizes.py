"""Output sizes: the reference's rule without buckets, the nearest bucket with them, and the
bounds on area and image aspect (issue 12: one client must not monopolise the VAE)."""
from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image

from camera.frames import output_size
from protocol.errors import ErrorCode, ProtocolError
from protocol.image import decode_image, probe_image
from protocol.limits import Limits
from deployments.ingress.sizes import SizeRule, nearest_bucket

BUCKETS = ((464, 832), (832, 464), (624, 624))


def png(h: int, w: int) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(np.zeros((h, w, 3), dtype=np.uint8)).save(buf, format="PNG")
    return buf.getvalue()


@pytest.mark.parametrize("area,h0,w0", [(480 * 832, 9, 16), (480 * 832, 3, 2), (64 * 112, 480, 832),
                                        (720 * 1280, 1000, 1000), (32 * 64, 7, 3)])
def test_without_buckets_the_reference_rule_holds_exactly(area, h0, w0):
    assert SizeRule().output(area, h0, w0) == output_size(area, h0, w0)


def test_buckets_map_size_and_aspect_to_the_nearest():
    rule = SizeRule(BUCKETS)
    assert rule.output(480 * 832, 9, 16) == (464, 832)  # the reference's own 16:9 size
    assert rule.output(480 * 832, 16, 9) == (832, 464)
    assert rule.output(480 * 832, 1, 1) == (624, 624)
    assert rule.output(480 * 832, 3, 4) == (624, 624)  # 0.75 is nearer 1 than 0.56 in log aspect
    assert rule.output(240 * 416, 9, 16) == (464, 832)  # one bucket per aspect: the area follows
    two_areas = ((464, 832), (720, 1280))
    assert nearest_bucket(two_areas, (704, 1264), 9 / 16) == (720, 1280)
    assert nearest_bucket(two_areas, (464, 832), 9 / 16) == (464, 832)


def test_area_over_the_cap_is_too_large():
    rule = SizeRule(max_output_area=256 * 448)
    assert rule.output(256 * 448, 9, 16) == output_size(256 * 448, 9, 16)
    with pytest.raises(ProtocolError) as e:
        rule.output(720 * 1280, 9, 16)
    assert e.value.code is ErrorCode.TOO_LARGE and "114688" in e.value.message
    with pytest.raises(ValueError, match="over the output area cap"):
        SizeRule(((720, 1280),), max_output_area=256 * 448)
    with pytest.raises(ValueError, match="multiples of 16"):
        SizeRule(((460, 832),))


def test_extreme_aspect_ratios_are_refused_from_the_header():
    """A 16x4000 PNG with size 720*1280 gave a 48x15168 output (issue 12): refused before decoding."""
    for h, w in ((16, 4000), (4000, 16), (100, 401)):
        with pytest.raises(ProtocolError) as e:
            probe_image(png(h, w))
        assert e.value.code is ErrorCode.BAD_IMAGE and "aspect ratio" in e.value.message
    with pytest.raises(ProtocolError) as e:
        decode_image(np.zeros((16, 4000, 3), dtype=np.uint8))
    assert e.value.code is ErrorCode.BAD_IMAGE
    assert probe_image(png(100, 400)) == (100, 400)  # 4:1 exactly is accepted
    assert decode_image(png(16, 4000), Limits(max_aspect_ratio=300.0)).shape == (16, 4000, 3)
    with pytest.raises(ValueError, match="max_aspect_ratio"):
        Limits(max_aspect_ratio=0.5)
