"""A scripted WebSocket server for the client's tests (no Ray): it sends a handshake, then a
test's script answers the client's frames as a broken or hostile server would."""
from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from websockets.exceptions import ConnectionClosed
from websockets.sync.server import ServerConnection, serve

from media.mp4_boxes import Sample, fragment, init_segment
from protocol.codec import encode
from protocol.messages import CameraServerConfig

CAMERA_PATH = "/v1/realtime/world/camera"


def video(chunk_id: int, frames: int) -> bytes:
    """A chunk's fMP4 payload as the muxer lays it out (chunk 0 with its init segment); its
    samples are no H.264, so it decodes to nothing."""
    samples = [Sample(b"\x00\x00\x00\x01\x65", is_sync=i == 0) for i in range(frames)]
    body = fragment(chunk_id % 2**31 + 1, chunk_id * 12, 1, samples)
    return (init_segment(48, 32, 16, 1, b"\x01\x42\x00\x1e\xff\xe0\x00") if chunk_id == 0 else b"") + body


@contextmanager
def scripted_server(script: Callable[[ServerConnection], None],
                    handshake: CameraServerConfig | bytes = CameraServerConfig(model="scripted")) -> Iterator[str]:
    """Serve `script` (after `handshake`: a config, or any frame) on a free port; the camera URL."""
    def handler(ws: ServerConnection) -> None:
        try:
            ws.send(handshake if isinstance(handshake, bytes) else encode(handshake))
            script(ws)
        except ConnectionClosed:
            pass

    server = serve(handler, "127.0.0.1", 0, max_size=None)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"ws://127.0.0.1:{server.socket.getsockname()[1]}{CAMERA_PATH}"
    finally:
        server.shutdown()
