"""Wire contract of /v1/realtime/world/camera: messages, codec, limits, image intake.

Pure: pydantic, msgpack, numpy, Pillow and the `camera` leaf package; never torch, ray,
PyAV or SciPy (tests/test_imports.py checks it).
"""
from protocol.codec import (decode, decode_reply, encode, encode_control, encode_infer, encode_plan, encode_reset,
                            encode_resume)
from protocol.errors import ErrorCode, ProtocolError
from protocol.image import decode_image, probe_image, raw_image
from protocol.limits import DEFAULT_LIMITS, Limits
from protocol.messages import (CameraServerConfig, Cameras, ControlRequest, ErrorReply, FrameReply, InferRequest,
                               Reply, Request, ResetOk, ResetRequest, ResumeOk, ResumeRequest, require_session_start)

__all__ = [
    "CameraServerConfig", "Cameras", "ControlRequest", "DEFAULT_LIMITS", "ErrorCode", "ErrorReply", "FrameReply",
    "InferRequest", "Limits", "ProtocolError", "Reply", "Request", "ResetOk", "ResetRequest", "ResumeOk", "ResumeRequest", "decode", "decode_image",
    "decode_reply", "encode", "encode_control", "encode_infer", "encode_plan", "encode_reset", "encode_resume",
    "probe_image", "raw_image", "require_session_start",
]
