"""Wire contract of /v1/realtime/world/camera: messages, codec, limits, image intake, fMP4.

Pure: pydantic, msgpack, numpy, Pillow, PyAV (and scipy in camera.py); never torch or ray.
"""
from protocol.codec import decode, decode_reply, encode, encode_infer, encode_reset
from protocol.errors import ErrorCode, ProtocolError
from protocol.fmp4 import Fmp4Muxer
from protocol.image import decode_image, probe_image, raw_image
from protocol.limits import DEFAULT_LIMITS, Limits
from protocol.messages import (CameraServerConfig, Cameras, ErrorReply, FrameReply, InferRequest, Reply, Request,
                               ResetOk, ResetRequest, require_session_start)
from protocol.reassembly import Fmp4Assembler

__all__ = [
    "CameraServerConfig", "Cameras", "DEFAULT_LIMITS", "ErrorCode", "ErrorReply", "Fmp4Assembler", "Fmp4Muxer",
    "FrameReply", "InferRequest", "Limits", "ProtocolError", "Reply", "Request", "ResetOk", "ResetRequest",
    "decode", "decode_image", "decode_reply", "encode", "encode_infer", "encode_reset", "probe_image",
    "raw_image", "require_session_start",
]
