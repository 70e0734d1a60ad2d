"""Wire contract of /v1/realtime/world/camera: messages, codec, limits, image intake.

Pure: pydantic, msgpack, numpy, Pillow and the `camera` leaf package; never torch, ray,
PyAV or SciPy (tests/test_imports.py checks it).
"""
from protocol.codec import decode, decode_reply, encode, validated
from protocol.errors import ErrorCode, ProtocolError
from protocol.image import decode_image, probe_image, raw_image
from protocol.limits import DEFAULT_LIMITS, Limits
from protocol.messages import (AckRequest, CameraServerConfig, Cameras, ControlRequest, DriveRequest, ErrorReply, Forked,
                               ForkRequest, FrameReply, InferRequest, Paused, Reply, Request, ResetOk, ResetRequest,
                               ResumeOk, ResumeRequest, Rewound, RewindRequest, require_session_start)

__all__ = [
    "AckRequest", "CameraServerConfig", "Cameras", "ControlRequest", "DEFAULT_LIMITS", "DriveRequest", "ErrorCode",
    "ErrorReply", "ForkRequest", "Forked", "FrameReply", "InferRequest", "Limits", "Paused", "ProtocolError", "Reply",
    "Request", "ResetOk", "ResetRequest", "ResumeOk", "ResumeRequest", "RewindRequest", "Rewound", "decode",
    "decode_image", "decode_reply", "encode", "probe_image", "raw_image", "require_session_start", "validated",
]
