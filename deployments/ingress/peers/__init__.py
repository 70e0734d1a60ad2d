"""Clip mode: vllm-omni's LingBot client and openpi clients on `/v1/realtime/world/camera`.

Their clients send one request per clip (N poses, `extra_body`, optional `session_id`) and
read float32 frames back (`{type: frame, index, total, video}`, `frames_per_chunk` frames per
message). `PeerTransport` sits between the socket and an ordinary `Connection`: it translates
each clip into our chunk infers and our replies into their messages, so every guarantee of the
Connection (limits, quotas, recovery, release when the socket ends) holds unchanged. The mode
is chosen per connection from the first request or by `?mode=clip` (docs/COMPATIBILITY.md).
"""
from deployments.ingress.peers.transport import CLIP_MODE, PeerTransport

__all__ = ["CLIP_MODE", "PeerTransport"]
