"""The bytes the client side packs, pinned: one SHA-256 per message kind, recorded from the
codec's loose-value encoders (`encode_infer`, `encode_plan`, ...) before the callers built the
models and `encode` packed them (issue 45). A change of the request builders or of
`protocol.codec.encode` that changes a byte on the wire fails here."""
from __future__ import annotations

import hashlib

import numpy as np
import pytest

from camera.plan import plan_session
from protocol.codec import encode
from protocol.messages import AckRequest, ControlRequest, ForkRequest, ResetRequest, ResumeRequest, RewindRequest
from protocol.requests import SessionStart, drive_request, infer_request, plan_requests

PNG = bytes.fromhex(  # a 16x16 PNG (the image bytes travel as they are)
    "89504e470d0a1a0a0000000d4948445200000010000000100802000000909168360000001949444154789c6394b389"
    "6220053091a47a54c3a88621a5010059ca00d4a37e1d570000000049454e44ae426082")
RGB = np.full((24, 32, 3), 7, np.uint8)
POSES = np.tile(np.eye(4, dtype=np.float32), (12, 1, 1))
POSES[:, :3, 3] = np.linspace(0, 1, 36, dtype=np.float32).reshape(12, 3)
K = np.tile(np.array([500.0, 480.0, 416.0, 240.0], np.float32), (12, 1))


def _plan():
    n = 33
    poses = np.tile(np.eye(4, dtype=np.float32), (n, 1, 1))
    poses[:, 2, 3] = np.linspace(0, 2, n)
    return plan_session(poses, np.tile(K[:1], (n, 1)), n)


def messages() -> dict[str, bytes]:
    plan = _plan()
    first = SessionStart(PNG, "a castle", seed=np.int64(7), size="480*832", intrinsics_resolution=(480, 832),
                         num_frames=33, translation_scale=np.float32(1.5), prefix_cache=False)
    return {
        "infer": encode(infer_request("s", POSES, K)),
        "infer_first": encode(infer_request("s", POSES, K, start=first, client_chunk_id=0)),
        "infer_rgb": encode(infer_request("s", POSES, K, start=SessionStart(RGB, "p"))),
        "infer_keys": encode(infer_request("s", from_keys=True, client_chunk_id=3, prompt_update="now",
                                           resume_token="tok", resume_from=np.int64(2))),
        "drive": encode(drive_request("d", SessionStart(PNG, "p", seed=3, size="480*832", intrinsics_resolution=(480, 832),
                                                        num_frames=33, translation_scale=2.0))),
        "reset": encode(ResetRequest(session_id="s")),
        "resume": encode(ResumeRequest(session_id="s", resume_token="tok", resume_from=4)),
        "resume_bare": encode(ResumeRequest(session_id="s", resume_token="tok")),
        "fork": encode(ForkRequest(session_id="s", new_session_id="t", at_chunk=2)),
        "rewind": encode(RewindRequest(session_id="s", to_chunk=0)),
        "control": encode(ControlRequest(session_id="s", event_id=5, keys=["D", "w"])),
        "ack": encode(AckRequest(session_id="s", chunk_id=3)),
        "plan": b"".join(encode(r) for r in plan_requests(
            plan, "s", SessionStart(PNG, "p", seed=1, size="480*832", intrinsics_resolution=(480, 832)),
            prompt_schedule={2: "q"})),
        "plan_open": b"".join(encode(r) for r in plan_requests(plan, "s", SessionStart(PNG, "p"), open_ended=True)),
    }


SHA256 = {
    "infer": "6e69a220d60caa77f62c96a7956702b2a293a3c936f6d3a8745778ed63ea291f",
    "infer_first": "ff5be54a5d375da158353cee2fc04fa3d098bcd2c02d1dd45ba003a304f40918",
    "infer_rgb": "e2cfff974984f53fab3dd404ad4b2ccb2f2164d533fff8ea21387141af162fb3",
    "infer_keys": "89b4226dfe9bc4a8276316f89076158ddf49c27fa1d0e7f1ac2f33cdb8f5dae0",
    "drive": "7f849023145cb3f6c6afacf3272336f742fa88175bcb069c5c72da3330682d3b",
    "reset": "ea14ab74cb8cc63a4b8748f86e3706860d1e09122878c4da02788173ff522284",
    "resume": "7525d77f40b7f0d9f18a76d194cd55c42c6304e7cc8fc1a83dd67d58632cfb8f",
    "resume_bare": "ac102464be0b07d9d2b5c7a740a1ebd741254996671aefe61e08b81d1953e97f",
    "fork": "b661f5e220e36a90430dcd8a154716e6f14bd26ce486a9e2e05412323f028589",
    "rewind": "b7942709aeaa300ce3ddc2aa0b152b22750ff548daca2a28d53ec48690bd38a1",
    "control": "06872feae0ead8088712a7c91666535a317e6af5de5eb6144ba2a6aae9a30e72",
    "ack": "6d8b8bc6f6fcc60f0ed0ee13497210e2b4721c5d27d2393929c88670356eb487",
    "plan": "270750e16f698c493eadb402c4ab08cb51881b5c0534494ce1a5931f70df2e0a",
    "plan_open": "a6702ec05a761a5b9583fe4be118f15a190c779fcffc566374d4515c937bad5f",
}


@pytest.mark.parametrize("name", sorted(SHA256))
def test_the_packed_bytes_are_pinned(name):
    assert hashlib.sha256(messages()[name]).hexdigest() == SHA256[name]
