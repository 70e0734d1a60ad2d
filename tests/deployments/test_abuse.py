"""Bad input against the live endpoint: a fuzzed corpus of malformed frames while a good session
streams, floods, oversized frames, silent and slow clients, bombs and broken cameras."""
from __future__ import annotations

import asyncio
import io
import math
import socket
import struct
import time
import zlib
from collections import Counter
from typing import Optional, Union

import httpx
import msgpack
import numpy as np
import websockets
from PIL import Image

from protocol.codec import decode
from protocol.errors import ErrorCode, ProtocolError
from protocol.image import decode_image
from protocol.limits import Limits
from protocol.messages import ErrorReply, FrameReply, ResetRequest
from protocol.codec import encode
from protocol.requests import SessionStart, infer_request

FUZZ_FRAMES = 10_000
FUZZ_CONNECTIONS = 4
FUZZ_BATCH = 50  # frames sent before their replies are read (below max_unsent_replies)
FUZZ_RATE = 300.0  # frames per second per connection: below the app's MESSAGES_PER_S (400)
SERVER_LIMITS = Limits(max_message_bytes=12 * 1024 * 1024, max_num_frames=4093)  # as the shared app's
Frame = Union[bytes, str]  # a binary or a text WebSocket frame


# ---- the corpus: malformed frames with the error code the server must answer ----

def _png(w: int, h: int, declared: Optional[tuple[int, int]] = None) -> bytes:
    """A w x h RGB PNG; `declared` rewrites the header's size (a decompression bomb keeps its tiny data)."""
    buf = io.BytesIO()
    Image.new("RGB", (w, h), (90, 120, 30)).save(buf, format="PNG")
    data = buf.getvalue()
    if declared is None:
        return data
    ihdr = struct.pack(">II", *declared) + data[24:29]
    return data[:16] + ihdr + struct.pack(">I", zlib.crc32(b"IHDR" + ihdr)) + data[33:]


def _jpeg(w: int, h: int) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (w, h), (10, 200, 60)).save(buf, format="JPEG")
    return buf.getvalue()


def expected_code(frame: Frame) -> Optional[ErrorCode]:
    """What the server answers to `frame` on a connection without a session; None: not malformed."""
    if isinstance(frame, str):
        return ErrorCode.BAD_MESSAGE
    try:
        req = decode(frame, SERVER_LIMITS)
    except ProtocolError as e:
        return e.code
    if isinstance(req, ResetRequest):
        return None
    if req.image is None or req.prompt is None:
        return ErrorCode.MISSING_FIELD
    try:
        decode_image(req.image, SERVER_LIMITS)
    except ProtocolError as e:
        return e.code
    return None  # a valid session start


class Corpus:
    """Seeded generator of malformed frames: random bytes, text, mutated valid frames, wrong
    types, broken arrays, broken images."""

    JUNK = [None, True, False, 0, -1, 2**63 - 1, -(2**63), 1.5, float("nan"), float("inf"), "", "x" * 300,
            b"", b"\x00" * 40, [], [1, 2, 3], [[1.0] * 4] * 4, {}, {"nd": True}, {"__ndarray__": True},
            {"a": {"b": {"c": [None]}}}]
    FIELDS = ["endpoint", "session_id", "image", "prompt", "cameras", "camera", "seed", "size", "num_frames",
              "translation_scale", "intrinsics_resolution", "client_chunk_id", "poses", "intrinsics"]

    def __init__(self, seed: int, poses: np.ndarray, intrinsics: np.ndarray) -> None:
        self.rng = np.random.default_rng(seed)
        self.poses, self.intrinsics = poses.astype(np.float32), intrinsics.astype(np.float32)
        small = _png(32, 32)
        self.valid = [
            encode(infer_request("fz", self.poses, self.intrinsics)),
            encode(infer_request("fz", self.poses, self.intrinsics, start=SessionStart(small, "p", num_frames=33))),
            encode(ResetRequest(session_id="fz")),
        ]
        self.images = [_png(1, 1, declared=(100_000, 100_000)),  # a bomb: 10^10 pixels declared, 1 stored
                       _png(8, 8), small[:60], _jpeg(64, 48)[:200], b"\x89PNG\r\n\x1a\n" + b"\0" * 30,
                       self.rng.bytes(100), np.zeros((20, 20, 4), np.uint8), np.zeros((20, 20, 3), np.float32),
                       np.full((20, 20, 3), 300, np.int32)]

    def frames(self, n: int) -> list[tuple[Frame, ErrorCode]]:
        out: list[tuple[Frame, ErrorCode]] = []
        makers = [self._random_bytes, self._text, self._mutated, self._wrong_types, self._bad_arrays,
                  self._bad_images]
        while len(out) < n:
            frame = makers[int(self.rng.integers(len(makers)))]()
            code = None if frame is None else expected_code(frame)
            if code is not None:
                out.append((frame, code))
        return out

    def _pack(self, obj: object) -> Optional[bytes]:
        try:
            return msgpack.packb(obj, use_bin_type=True, default=_ndarray_map)
        except (OverflowError, TypeError, ValueError):
            return None

    def _random_bytes(self) -> bytes:
        return self.rng.bytes(int(self.rng.integers(0, 64)))

    def _text(self) -> str:
        return "".join(chr(int(c)) for c in self.rng.integers(32, 0x2FF, int(self.rng.integers(0, 40))))

    def _mutated(self) -> bytes:
        data = bytearray(self.valid[int(self.rng.integers(len(self.valid)))])
        kind = int(self.rng.integers(4))
        if kind == 0:  # flip bytes
            for i in self.rng.integers(0, len(data), int(self.rng.integers(1, 9))):
                data[i] = int(self.rng.integers(256))
        elif kind == 1:  # truncate
            del data[int(self.rng.integers(0, len(data))):]
        elif kind == 2:  # insert
            i = int(self.rng.integers(0, len(data)))
            data[i:i] = self.rng.bytes(int(self.rng.integers(1, 16)))
        else:  # trailing garbage
            data += self.rng.bytes(int(self.rng.integers(1, 8)))
        return bytes(data)

    def _base(self) -> dict:
        return {"endpoint": "infer", "session_id": "fz",
                "cameras": {"poses": self.poses, "intrinsics": self.intrinsics}}

    def _wrong_types(self) -> Optional[bytes]:
        msg = self._base()
        for _ in range(int(self.rng.integers(1, 4))):
            field = self.FIELDS[int(self.rng.integers(len(self.FIELDS)))]
            msg[field] = self.JUNK[int(self.rng.integers(len(self.JUNK)))]
        if self.rng.random() < 0.1:
            msg = {1: "int key", **msg} if self.rng.random() < 0.5 else [msg]
        return self._pack(msg)

    def _bad_arrays(self) -> Optional[bytes]:
        poses, k = self.poses.copy(), self.intrinsics.copy()
        i = int(self.rng.integers(len(poses)))
        case = int(self.rng.integers(12))
        if case == 0:
            poses[i, :3, :3] *= 1.0 + self.rng.uniform(0.01, 2.0)  # non-rigid (scaled)
        elif case == 1:
            poses[i, :3, 0] *= -1  # a reflection: det -1
        elif case == 2:
            poses[i, 3, int(self.rng.integers(4))] += 0.5  # last row not 0 0 0 1
        elif case == 3:
            poses[i, int(self.rng.integers(3)), 3] = float(self.rng.choice([np.nan, np.inf, -np.inf]))
        elif case == 4:
            k[i, int(self.rng.integers(4))] = float(self.rng.choice([np.nan, np.inf]))  # NaN intrinsics
        elif case == 5:
            k[i, int(self.rng.integers(2))] = -abs(k[i, 0])  # negative focal length
        elif case == 6:
            poses, k = poses[:0], k[:0]  # N = 0
        elif case == 7:
            poses, k = np.repeat(poses, 5, axis=0), np.repeat(k, 5, axis=0)  # N = 60 > 48
        elif case == 8:
            k = k[:, :3]
        elif case == 9:
            k = k[:-1]  # counts differ
        else:
            shapes = [[12, 4, 4], [10**9, 4, 4], [12, 4], [0], [-1, 4, 4], [12, 4, 4, 1, 1]]
            raw = {"nd": True, "type": str(self.rng.choice(["|O", "<c8", "S3", "V4", "<f4", "<i8", "zz"])),
                   "kind": str(self.rng.choice(["", "O", "V"])),
                   "shape": shapes[int(self.rng.integers(len(shapes)))],
                   "data": self.rng.bytes(int(self.rng.integers(0, 1000)))}
            msg = self._base()
            msg["cameras"]["poses" if case == 10 else "intrinsics"] = raw
            return self._pack(msg)
        msg = self._base()
        msg["cameras"] = {"poses": poses, "intrinsics": k}
        return self._pack(msg)

    def _bad_images(self) -> Optional[bytes]:
        msg = self._base()
        msg["image"] = self.images[int(self.rng.integers(len(self.images)))]
        msg["prompt"] = "a prompt"
        return self._pack(msg)


def _ndarray_map(obj: object) -> object:
    if isinstance(obj, np.ndarray):
        return {"nd": True, "type": obj.dtype.str, "kind": b"", "shape": list(obj.shape), "data": obj.tobytes()}
    raise TypeError(type(obj).__name__)


def test_the_corpus_is_malformed_and_covers_every_input_error(example):
    frames = Corpus(7, *example.chunk(0)).frames(2000)
    codes = Counter(code for _, code in frames)
    assert set(codes) == {ErrorCode.BAD_MESSAGE, ErrorCode.MISSING_FIELD, ErrorCode.BAD_CAMERAS,
                          ErrorCode.BAD_IMAGE, ErrorCode.TOO_LARGE}, codes


# ---- the live endpoint ----

async def _fuzz_connection(connect, frames: list[tuple[Frame, ErrorCode]]) -> Counter:
    """Send `frames` in paced batches; every reply must be an error with the expected code."""
    seen: Counter = Counter()
    async with connect() as c:
        for lo in range(0, len(frames), FUZZ_BATCH):
            batch = frames[lo:lo + FUZZ_BATCH]
            t0 = time.monotonic()
            for frame, _ in batch:
                await c.ws.send(frame)
            for frame, code in batch:
                reply = await c.recv(timeout=60)
                assert isinstance(reply, ErrorReply) and reply.code is code, (frame[:80], code, reply)
                seen[code] += 1
            await asyncio.sleep(max(0.0, len(batch) / FUZZ_RATE - (time.monotonic() - t0)))
    return seen


async def _good_sessions(connect, example, reference: list[bytes], stop: asyncio.Event) -> tuple[int, list[float]]:
    """Stream 3-chunk sessions until `stop`; each must equal `reference` byte for byte."""
    sessions, latencies = 0, []
    async with connect() as c:
        while not stop.is_set() or sessions == 0:
            sid = f"good-{sessions}"
            t0 = time.monotonic()
            replies = await c.run_session(sid, example)
            latencies.append((time.monotonic() - t0) / len(replies))
            assert [r.video for r in replies] == reference, f"session {sid} differs from the reference"
            await c.reset(sid)
            sessions += 1
    return sessions, latencies


def test_fuzzed_frames_get_typed_errors_while_a_good_session_streams(server, connect, example):
    corpus = Corpus(2024, *example.chunk(0)).frames(FUZZ_FRAMES)
    shares = [corpus[i::FUZZ_CONNECTIONS] for i in range(FUZZ_CONNECTIONS)]

    async def go():
        async with connect() as c:
            t0 = time.monotonic()
            reference = [r.video for r in await c.run_session("good-reference", example)]
            baseline = (time.monotonic() - t0) / 3
            await c.reset("good-reference")
        stop = asyncio.Event()
        good = asyncio.create_task(_good_sessions(connect, example, reference, stop))
        t0 = time.monotonic()
        seen = await asyncio.gather(*(_fuzz_connection(connect, share) for share in shares))
        seconds = time.monotonic() - t0
        stop.set()
        sessions, latencies = await good
        return baseline, sum(seen, Counter()), seconds, sessions, latencies

    baseline, seen, seconds, sessions, latencies = asyncio.run(go())
    assert sum(seen.values()) == FUZZ_FRAMES
    print(f"RELIABILITY fuzz: malformed={FUZZ_FRAMES} connections={FUZZ_CONNECTIONS} seconds={seconds:.1f} "
          f"codes={dict((k.value, v) for k, v in seen.items())} good_sessions={sessions} "
          f"good_chunks={3 * sessions} good_chunk_s_before={baseline:.2f} "
          f"good_chunk_s_during_median={float(np.median(latencies)):.2f} lost=0")
    assert httpx.get(f"{server.http}/healthz", timeout=10).status_code == 200  # no replica crashed
    server.wait_held(0)


def _opcodes(response: bytes) -> list[int]:
    """Opcodes of the complete (unmasked) server frames after an HTTP upgrade response."""
    data = response.split(b"\r\n\r\n", 1)[-1]
    ops = []
    while len(data) >= 2:
        length, at = data[1] & 0x7F, 2
        if length == 126:
            length, at = struct.unpack(">H", data[2:4])[0], 4
        elif length == 127:
            length, at = struct.unpack(">Q", data[2:10])[0], 10
        if len(data) < at + length:
            break
        ops.append(data[0] & 0x0F)
        data = data[at + length:]
    return ops


async def _closed(ws: websockets.ClientConnection, timeout: float = 30.0) -> tuple[int, str, int]:
    """Read until the server closes: (close code, reason, replies read before)."""
    replies = 0
    try:
        while True:
            await asyncio.wait_for(ws.recv(), timeout)
            replies += 1
    except websockets.ConnectionClosed as e:
        return e.rcvd.code if e.rcvd else 1006, e.rcvd.reason if e.rcvd else "", replies


def test_a_flood_of_tiny_frames_is_closed_by_policy_while_others_stream(strict_server, strict_connect, example,
                                                                         api_keys):
    """10 000 frames as fast as possible: the connection is closed with 1008 after its burst,
    while a session on another connection streams on unharmed."""
    flood_frames = 10_000
    reset = encode(ResetRequest(session_id="nothing-open"))

    async def go():
        async with strict_connect(api_keys[3]) as good:
            await good.infer("calm", example, 0, first=True)
            async with strict_connect(api_keys[3]) as flood:
                t0 = time.monotonic()
                for _ in range(flood_frames):
                    try:
                        await flood.ws.send(reset)  # a valid frame: only the rate limit closes
                    except websockets.ConnectionClosed:
                        break
                sent_s = time.monotonic() - t0
                closed = await _closed(flood.ws)
            calm = [await good.recv()]
            await good.infer("calm", example, 1, first=False)
            calm.append(await good.recv())
            await good.reset("calm")
        return closed, sent_s, calm

    (code, reason, replies), sent_s, calm = asyncio.run(go())
    assert code == 1008 and "messages per second" in reason, (code, reason)
    assert replies < 200  # the handshake, the burst of 40 and the refill meanwhile: then closed
    assert all(isinstance(r, FrameReply) for r in calm), calm
    print(f"RELIABILITY flood: frames_sent={flood_frames} in {sent_s:.2f}s answered={replies - 1} close={code}")
    strict_server.wait_held(0)


def test_silent_slow_and_idle_clients_are_closed(strict_server, strict_connect, api_keys):
    """No first frame within 2 s, a frame dribbled in byte by byte (slow loris), and silence
    after a reply for 4 s: each connection is closed with 1008 and a reason."""
    host, port = strict_server.http.removeprefix("http://").split("/")[0].split(":")

    async def silent():
        async with strict_connect(api_keys[3]) as c:
            t0 = time.monotonic()
            code, reason, _ = await _closed(c.ws)
            return code, reason, time.monotonic() - t0

    async def idle():
        async with strict_connect(api_keys[3]) as c:
            await c.send(b"\x90")
            await c.recv()
            t0 = time.monotonic()
            code, reason, _ = await _closed(c.ws)
            return code, reason, time.monotonic() - t0

    def slow_loris() -> tuple[list[int], float]:
        """Upgrade, then send a masked frame header announcing 1000 bytes and one byte a second:
        the opcodes of the server's frames until it closes, and when it closed."""
        with socket.create_connection((host, int(port)), timeout=30) as s:
            s.sendall((f"GET /strict/v1/realtime/world/camera HTTP/1.1\r\nHost: {host}\r\nUpgrade: websocket\r\n"
                       "Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
                       f"Sec-WebSocket-Version: 13\r\nAuthorization: Bearer {api_keys[3]}\r\n\r\n").encode())
            t0 = time.monotonic()
            s.sendall(bytes([0x82, 0x80 | 126]) + struct.pack(">H", 1000) + b"\0\0\0\0")
            received = b""
            s.settimeout(1.0)
            while time.monotonic() - t0 < 20 and 8 not in _opcodes(received):
                try:
                    chunk = s.recv(4096)
                except socket.timeout:
                    s.sendall(b"\0")  # one more payload byte
                    continue
                if not chunk:
                    break
                received += chunk
            assert received.startswith(b"HTTP/1.1 101"), received[:100]
            return _opcodes(received), time.monotonic() - t0

    async def go():
        return await asyncio.gather(silent(), idle(), asyncio.to_thread(slow_loris))

    (s_code, s_reason, s_after), (i_code, i_reason, i_after), (loris, loris_s) = asyncio.run(go())
    assert s_code == 1008 and "no message within 2" in s_reason and s_after < 10, (s_code, s_reason, s_after)
    # the strict app's idle_timeout_s (conftest.STRICT_LIMITS): 7 s
    assert i_code == 1008 and "idle for 7" in i_reason and 6 < i_after < 18, (i_code, i_reason, i_after)
    # The proxy's WebSocket layer may replace the policy close by its own (it cancels the half-read frame).
    assert loris[0] == 2 and loris[-1] == 8 and 1.5 < loris_s < 15, (loris, loris_s)
    print(f"RELIABILITY slow clients: silent closed after {s_after:.1f}s, idle after {i_after:.1f}s, "
          f"slow loris after {loris_s:.1f}s")


def test_oversized_frames_bombs_and_broken_cameras_get_typed_errors(strict_server, strict_connect, example,
                                                                    api_keys):
    """Over max_message_bytes: too_large; over the proxy's 16 MiB: closed with 1009. A PNG that
    declares 10^10 pixels, a non-rigid pose and NaN intrinsics: typed errors, and the connection
    still opens a session afterwards."""
    poses, intrinsics = example.chunk(0)
    bent = poses.copy()
    bent[3, :3, :3] *= 1.2
    nan_k = intrinsics.copy()
    nan_k[0, 2] = math.nan

    async def go():
        async with strict_connect(api_keys[3]) as c:
            replies = []
            await c.send(b"\x91" + msgpack.packb(b"\0" * (300 * 1024), use_bin_type=True))
            replies.append(await c.recv())
            bomb = _png(1, 1, declared=(100_000, 100_000))
            await c.send(msgpack.packb({"session_id": "b", "image": bomb, "prompt": "p",
                                        "cameras": {"poses": poses.tolist(), "intrinsics": intrinsics.tolist()}}))
            replies.append(await c.recv())
            await c.send(msgpack.packb({"session_id": "b", "cameras": {"poses": bent.tolist(),
                                                                       "intrinsics": intrinsics.tolist()}}))
            replies.append(await c.recv())
            await c.send(msgpack.packb({"session_id": "b", "cameras": {"poses": poses.tolist(),
                                                                       "intrinsics": nan_k.tolist()}}))
            replies.append(await c.recv())
            await c.infer("b", example, 0, first=True)
            replies.append(await c.recv())
            await c.reset("b")
        async with strict_connect(api_keys[3]) as c:
            try:
                await c.send(b"\0" * (16 * 1024 * 1024 + 1))
            except websockets.ConnectionClosed as e:
                # The proxy negotiates no compression (proxy_guard): the frame goes out whole, and
                # the proxy closes the socket while it is still being sent.
                closed = (e.rcvd.code if e.rcvd else 1006, e.rcvd.reason if e.rcvd else "", 0)
            else:
                closed = await _closed(c.ws)
        return replies, closed

    replies, (code, _, _) = asyncio.run(go())
    codes = [ErrorCode.TOO_LARGE, ErrorCode.BAD_IMAGE, ErrorCode.BAD_CAMERAS, ErrorCode.BAD_CAMERAS]
    for reply, expected in zip(replies, codes):
        assert isinstance(reply, ErrorReply) and reply.code is expected, (expected, reply)
    assert "pixels" in replies[1].message and "rigid" in replies[2].message
    assert isinstance(replies[-1], FrameReply)
    assert code == 1009, code


def test_a_client_that_stops_reading_is_disconnected(server, connect, example):
    """A client that sends chunks but never reads the replies: Serve's replica-side sends never
    block, so the WebSocket keepalive of the proxy (ping every 20 s, 20 s to answer) is what
    closes it once its receive window stays full; the session is then freed at once."""
    poses, intrinsics = example.chunk(0)

    def connections() -> int:
        return httpx.get(f"{server.http}/healthz", timeout=10).json()["connections"]

    async def go():
        # max_queue=1: the client library stops reading the socket after two unread messages;
        # ping_interval=None: the client's own keepalive must not be the one that closes.
        before = connections()
        ws = await websockets.connect(server.ws, max_queue=1, ping_interval=None, max_size=None)
        t0 = time.monotonic()
        for k in range(3):
            extra = SessionStart(example.image, example.prompt) if k == 0 else None
            await ws.send(encode(infer_request("deaf", *example.chunk(k), start=extra, client_chunk_id=k)))
        assert await asyncio.to_thread(connections) == before + 1
        while time.monotonic() - t0 < 60 and await asyncio.to_thread(connections) > before:
            await asyncio.sleep(1.0)
        closed_after = time.monotonic() - t0
        ws.transport.abort()
        return closed_after

    closed_after = asyncio.run(go())
    assert closed_after < 50, "the server kept a client that does not read for 50 s"
    server.wait_held(0)
    print(f"RELIABILITY non-reader: disconnected by the server after {closed_after:.0f}s")
