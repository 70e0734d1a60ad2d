"""The driver of a driven session (`drive`) inside one Connection against recording fake
deployments (no Ray): late binding of the keys at the chunk's DiT start, one chunk queued
ahead, the ack window, pause and resume, refusals that leave the session driving, the end of
the socket. The same behaviours through the real app: test_drive.py."""
from __future__ import annotations

import asyncio
import io
from types import SimpleNamespace

import msgpack
import numpy as np
from PIL import Image

from camera.keys import KeySteps, key_chunk_poses
from connection_fakes import FakeDeployment, FakeMetrics, ScriptedSocket
from deployments.config import AppArgs
from deployments.errors import Busy, Preempted
from deployments.wire import NoiseSnapshot, StepResult
from deployments.ingress.connection import Backends, Connection
from deployments.ingress.journal import SessionJournal
from deployments.ingress.parking import ParkedSession, token_digest
from deployments.wire import SessionOptions
from protocol.errors import ErrorCode
from protocol.limits import Limits
from protocol.messages import CameraServerConfig, ErrorReply, FrameReply, Paused, ResumeOk
from protocol.codec import encode
from protocol.messages import ResumeRequest, ControlRequest, AckRequest
from protocol.requests import SessionStart, infer_request, drive_request

DIT_S = 0.2  # a DiT step of the fakes; VAE calls take VAE_S
VAE_S = 0.03


def png() -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (64, 36), (90, 120, 150)).save(buf, "PNG")
    return buf.getvalue()


def frames(sent) -> list[FrameReply]:
    return [r for r in sent if isinstance(r, FrameReply)]


class ClosingDeployment(FakeDeployment):
    """A fake whose `close` may come while a call runs (the teardown closes at once; a replica
    frees the session when the running call ends)."""

    async def call(self, method: str, args: tuple):
        if method == "close":
            self.log.append(f"{self.name}.close")
            return None
        return await super().call(method, args)


class PreemptingDiT(ClosingDeployment):
    """A DiT whose step runs as 4 denoising slices and gives the chunk up between them once
    `preempt` asked for it (as DiTDeployment: `Preempted`, the chunk not counted)."""

    def __init__(self, *args) -> None:
        super().__init__(*args)
        self.chunks = 0  # chunks made
        self.flag: int | None = None

    async def call(self, method: str, args: tuple):
        if method == "preempt":
            _key, chunk_id = args
            self.log.append(f"dit.preempt {chunk_id}")
            if chunk_id != self.chunks:
                return False
            self.flag = chunk_id
            return True
        if method != "step":
            return await super().call(method, args)
        assert self.in_flight == 0, "two steps in flight"
        self.in_flight += 1
        chunk = self.chunks
        self.log.append("dit.step start")
        try:
            for _ in range(4):
                if self.flag == chunk:
                    self.log.append(f"dit.step preempted {chunk}")
                    raise Preempted(f"chunk {chunk} given up")
                await asyncio.sleep(self.seconds / 4)
        finally:
            self.in_flight -= 1
            if self.flag is not None and self.flag <= chunk:
                self.flag = None
        self.log.append("dit.step end")
        self.chunks += 1
        return StepResult(latents=np.zeros((16, 3, 4, 6), np.float32), noise=NoiseSnapshot(np.zeros(8, np.uint8), False),
                          timings={"dit": self.seconds}, replica="d")


class Rig:
    """One Connection on fakes, run in the background of a test coroutine."""

    def __init__(self, max_unacked: int = 2, dit: type = ClosingDeployment, preempt: bool = True) -> None:
        self.log: list[str] = []
        self.backends = Backends(text=FakeDeployment("text", self.log, 0.0),
                                 vae=ClosingDeployment("vae", self.log, VAE_S),
                                 dit=dit("dit", self.log, DIT_S))
        self.ws = ScriptedSocket()
        self.args = AppArgs(controls={"max_unacked_chunks": max_unacked, "preempt": preempt},
                            model={"default_size": "32*64"})

    async def __aenter__(self) -> "Rig":
        self.conn = Connection(self.ws, self.backends, self.args, Limits(), CameraServerConfig(model="tiny"),
                               FakeMetrics())
        self.task = asyncio.create_task(self.conn.run())
        return self

    async def __aexit__(self, *exc) -> None:
        self.ws.leave()
        await asyncio.wait_for(self.task, 30)

    def steps(self) -> int:
        return self.log.count("dit.step start")

    async def frame(self, chunk_id: int, timeout: float = 10.0) -> FrameReply:
        return await self.ws.wait_for(lambda sent: next((r for r in frames(sent) if r.chunk_id == chunk_id), None),
                                      timeout)

    async def logged(self, entry: str, timeout: float = 10.0) -> None:
        """Until the fakes log `entry` (polled: the socket's wait_for wakes on replies only)."""
        async def wait():
            while entry not in self.log:
                await asyncio.sleep(0.002)
        await asyncio.wait_for(wait(), timeout)

    async def paused(self, n: int = 1) -> Paused:
        """The n-th `paused` reply."""
        found = await self.ws.wait_for(lambda sent: [r for r in sent if isinstance(r, Paused)][n - 1:])
        return found[0]


def test_the_keys_bind_when_the_dit_takes_the_chunk():
    """A key pressed while chunk k runs shows in chunk k + 1 whose DiT job starts after it (the
    queued chunk reads the keys then, not when it was queued), continuing the camera."""
    async def go():
        async with Rig(max_unacked=16) as rig:
            rig.ws.send(encode(ControlRequest(session_id="d", event_id=1, keys=["w"])))
            rig.ws.send(encode(drive_request("d", SessionStart(png(), "a street"))))
            await rig.frame(1)  # chunk 2 runs on the DiT now, chunk 3 is queued behind it
            steps_then = rig.steps()
            rig.ws.send(encode(ControlRequest(session_id="d", event_id=2, keys=["l"])))
            await rig.frame(5)
            rig.ws.send(encode(ControlRequest(session_id="d", event_id=3, keys=[])))
            await rig.paused()
            replies = frames(rig.ws.sent)
        return steps_then, replies

    steps_then, replies = asyncio.run(go())
    ids = [r.chunk_id for r in replies]
    assert ids == list(range(len(ids)))
    first_l = next(r.chunk_id for r in replies if r.event_id == 2)
    # The control came while chunk `steps_then - 1` was on the DiT: the next chunk took it.
    assert first_l == steps_then
    assert all(r.event_id == 1 for r in replies[:first_l])
    steps = KeySteps()
    expected = key_chunk_poses(None, {"w"}, steps)
    for r in replies[1:]:
        keys = {"w"} if r.event_id == 1 else {"l"} if r.event_id == 2 else set()
        expected = key_chunk_poses(expected[-1], keys, steps)
        np.testing.assert_allclose(r.poses, expected, atol=1e-5)


def test_the_ack_window_bounds_the_chunks_started():
    async def go():
        async with Rig(max_unacked=2) as rig:
            rig.ws.send(encode(ControlRequest(session_id="a", event_id=1, keys=["w"])))
            rig.ws.send(encode(drive_request("a", SessionStart(png(), "a street"))))
            await rig.frame(1)
            await asyncio.sleep(4 * DIT_S)
            held_back = rig.steps()  # chunks 0 and 1, nothing acked
            rig.ws.send(encode(AckRequest(session_id="a", chunk_id=0)))
            await rig.frame(2)
            await asyncio.sleep(4 * DIT_S)
            after_one = rig.steps()
            rig.ws.send(encode(AckRequest(session_id="a", chunk_id=2)))
            rig.ws.send(encode(AckRequest(session_id="a", chunk_id=1)))  # older: changes nothing
            await rig.frame(4)
            await asyncio.sleep(4 * DIT_S)
            after_three = rig.steps()
            rig.ws.send(encode(ControlRequest(session_id="a", event_id=2, keys=[])))
        return held_back, after_one, after_three

    assert asyncio.run(go()) == (2, 3, 5)


def test_no_key_pauses_and_a_control_with_keys_resumes():
    async def go():
        async with Rig(max_unacked=16) as rig:
            # no key held: chunk 0 shows the scene, then a pause
            rig.ws.send(encode(drive_request("p", SessionStart(png(), "a street"))))
            first = await rig.paused()
            await asyncio.sleep(5 * DIT_S)
            idle_steps = rig.steps()
            rig.ws.send(encode(ControlRequest(session_id="p", event_id=7, keys=["s"])))
            await rig.frame(3)
            rig.ws.send(encode(ControlRequest(session_id="p", event_id=8, keys=[])))
            second = await rig.paused(2)
            await asyncio.sleep(5 * DIT_S)
            sent = list(rig.ws.sent)
            steps = rig.steps()
        return first, idle_steps, second, sent, steps

    first, idle_steps, second, sent, steps = asyncio.run(go())
    assert first.session_id == "p" and first.next_chunk_id == 1 and idle_steps == 1
    replies = frames(sent)
    assert replies[0].event_id is None and all(r.event_id in (7, 8) for r in replies[1:])
    # Every chunk started was answered before the `paused`, and none after it.
    assert second.next_chunk_id == len(replies) == steps
    assert sent.index(second) > max(sent.index(r) for r in replies)
    assert sum(isinstance(r, Paused) for r in sent) == 2  # one per pause


def test_refusals_leave_the_session_driving():
    async def go():
        async with Rig(max_unacked=16) as rig:
            rig.ws.send(encode(ControlRequest(session_id="r", event_id=1, keys=["w"])))
            rig.ws.send(encode(drive_request("r", SessionStart(png(), "a street"))))
            await rig.frame(0)
            rig.ws.send(encode(AckRequest(session_id="r", chunk_id=300)))  # not sent yet
            rig.ws.send(encode(AckRequest(session_id="other", chunk_id=0)))  # no such driven session
            rig.ws.send(encode(infer_request("r", from_keys=True)))  # infers do not mix with the driver
            # A drive whose image does not decode: refused before it replaces the driven session.
            rig.ws.send(msgpack.packb({"endpoint": "drive", "session_id": "r", "image": b"not an image", "prompt": "p"}))
            errors = await rig.ws.wait_for(lambda sent: [r for r in sent if isinstance(r, ErrorReply)][3:] and
                                           [r for r in sent if isinstance(r, ErrorReply)])
            before = max(r.chunk_id for r in frames(rig.ws.sent))
            await rig.frame(before + 2)
            rig.ws.send(encode(ControlRequest(session_id="r", event_id=2, keys=[])))
            await rig.paused()
        return errors

    errors = asyncio.run(go())
    assert [e.code for e in errors] == [ErrorCode.BAD_MESSAGE] * 3 + [ErrorCode.BAD_IMAGE]
    assert all(e.session_id in ("r", "other") for e in errors)


def test_the_socket_end_stops_the_driver_and_releases():
    async def go():
        async with Rig(max_unacked=16) as rig:
            rig.ws.send(encode(ControlRequest(session_id="x", event_id=1, keys=["w"])))
            rig.ws.send(encode(drive_request("x", SessionStart(png(), "a street"))))
            await rig.frame(0)
            await asyncio.sleep(DIT_S / 2)  # mid-chunk
        steps = rig.steps()
        await asyncio.sleep(4 * DIT_S)
        return rig, steps

    rig, steps = asyncio.run(go())
    assert rig.steps() == steps  # nothing started after the end
    assert "dit.close" in rig.log and "vae.close" in rig.log
    assert rig.conn._driving.driver is None


class FullDiT(ClosingDeployment):
    """A DiT whose every slot is taken: its admission answers `busy`."""

    async def call(self, method: str, args: tuple):
        if method == "reserve":
            raise Busy("all 4 session slots of this replica are taken; retry in 2 s", 2.0)
        return await super().call(method, args)


def test_a_drive_refused_for_capacity_is_answered_busy_once_and_never_paused():
    """Issue 43 item 7: a `drive` the DiT cannot admit got `busy`, then `paused` (next_chunk_id
    1), then `busy` again; it is one `busy`, and the driver starts nothing more."""
    async def go(keys: list[str]):
        async with Rig(dit=FullDiT) as rig:
            if keys:
                rig.ws.send(encode(ControlRequest(session_id="full", event_id=1, keys=keys)))
            rig.ws.send(encode(drive_request("full", SessionStart(png(), "a street"))))
            await rig.ws.wait_for(lambda sent: any(isinstance(r, ErrorReply) for r in sent))
            await asyncio.sleep(6 * DIT_S)  # whatever else would come
            sent = list(rig.ws.sent[1:])
        return sent, rig.steps(), rig.conn._driving.driver

    for keys in ([], ["w"]):
        sent, steps, driver = asyncio.run(go(keys))
        assert [(type(r), getattr(r, "code", None)) for r in sent] == [(ErrorReply, ErrorCode.BUSY)], (keys, sent)
        assert sent[0].session_id == "full" and sent[0].retry_after_s == 2.0
        assert steps == 0 and (driver is None or not driver.running)


class FakeParking:
    """A parking that holds one parked session: `claim` hands it over; it parks nothing else."""

    def __init__(self, record: ParkedSession) -> None:
        self.record = record

    def __getattr__(self, method: str):
        async def remote(*args):
            return self.record if method == "claim" else False
        return SimpleNamespace(remote=remote)


def test_a_resume_from_beyond_the_chunks_sent_counts_as_the_chunks_sent():
    """Issue 43 item 5: a driven session resumed with `resume_from` 341 (2 chunks were sent)
    ran without flow control, the ack window counting from 341. It counts from the 2 sent:
    chunks 2 and 3 start, then nothing until an ack."""
    spec = SessionOptions(session_id="r", prompt="a street", image_digest="d", resolution=(32, 48), seed=42,
                          total_latent_frames=None, translation_scale=None, intrinsics_resolution=(480, 832))
    sent = [FrameReply(session_id="r", chunk_id=k, video=b"v", num_frames=12, resolution=(32, 48),
                       poses=key_chunk_poses(None, set(), KeySteps()).astype(np.float32)) for k in range(2)]
    record = ParkedSession(spec=spec, journal=SessionJournal(np.zeros((36, 64, 3), np.uint8), 1 << 20),
                           image=np.zeros((36, 64, 3), np.uint8), key="r~k", dit_key="r~d", vae_key="r~v",
                           next_chunk=2, sent=2, prompt="a street", replies=sent,
                           token_digest=token_digest("t" * 32), driven=True)

    async def go():
        rig = Rig(max_unacked=2)
        backends = Backends(text=rig.backends.text, vae=rig.backends.vae, dit=rig.backends.dit,
                            parking=FakeParking(record))
        rig.conn = Connection(rig.ws, backends, rig.args, Limits(), CameraServerConfig(model="tiny"), FakeMetrics(),
                              resumable=True)
        rig.task = asyncio.create_task(rig.conn.run())
        rig.ws.send(encode(ResumeRequest(session_id="r", resume_token="t" * 32, resume_from=341)))
        resumed = await rig.ws.wait_for(lambda sent: next((r for r in sent if isinstance(r, ResumeOk)), None))
        rig.ws.send(encode(ControlRequest(session_id="r", event_id=1, keys=["w"])))
        await rig.frame(3)
        await asyncio.sleep(6 * DIT_S)
        held_back = rig.steps()
        rig.ws.send(encode(AckRequest(session_id="r", chunk_id=2)))
        await rig.frame(4)
        await rig.__aexit__()
        return resumed, held_back

    resumed, held_back = asyncio.run(go())
    assert resumed.next_chunk_id == 2 and resumed.replayed == 0
    assert held_back == 2  # chunks 2 and 3: the window of 2 past the 2 chunks the client has


def _expected(replies: list[FrameReply], keys_of: dict) -> None:
    steps, last = KeySteps(), None
    for r in replies:
        poses = key_chunk_poses(last, keys_of.get(r.event_id, set()), steps)
        np.testing.assert_allclose(r.poses, poses, atol=1e-5)
        last = poses[-1]


def _w_then_l(preempt: bool = True, then=None, until: int = 3, release_id: int = 3):
    """Drive W from the start, press L as chunk 1's frame arrives (chunk 2 then runs on the DiT,
    bound to W), `await then(rig)`, release once chunk `until` arrived: (frames, the fakes' log)."""
    async def go():
        async with Rig(max_unacked=16, dit=PreemptingDiT, preempt=preempt) as rig:
            rig.ws.send(encode(ControlRequest(session_id="d", event_id=1, keys=["w"])))
            rig.ws.send(encode(drive_request("d", SessionStart(png(), "a street"))))
            await rig.frame(1)  # chunk 2 has run on the DiT for about a decode (VAE_S), of DIT_S
            rig.ws.send(encode(ControlRequest(session_id="d", event_id=2, keys=["l"])))
            if then is not None:
                await then(rig)
            await rig.frame(until)
            rig.ws.send(encode(ControlRequest(session_id="d", event_id=release_id, keys=[])))
            await rig.paused()
        return frames(rig.ws.sent), list(rig.log)

    return asyncio.run(go())


def test_keys_changed_while_the_chunk_runs_give_it_up_and_it_shows_them():
    """controls.preempt: chunk 2 runs bound to W when L is pressed; the DiT gives it up at its
    next slice and chunk 2 is made again, bound to L and continuing chunk 1's camera."""
    replies, log = _w_then_l()
    assert [r.chunk_id for r in replies] == list(range(len(replies)))
    assert "dit.preempt 2" in log and "dit.step preempted 2" in log
    assert [r.event_id for r in replies[:3]] == [1, 1, 2]  # without preemption chunk 3 would show L first
    assert log.count("dit.step preempted 2") == 1  # and made again
    given_up = sum(e.startswith("dit.step preempted") for e in log)  # the release may give one more up
    assert log.count("dit.step start") - log.count("dit.step end") - given_up in (0, 1)  # one may run at the end
    _expected(replies, {1: {"w"}, 2: {"l"}})


def test_a_chunk_is_given_up_once_however_often_the_keys_change():
    """A chunk made again runs to its end: keys changing during it wait for the next chunk."""
    async def change_twice_while_it_is_made_again(rig):
        await rig.logged("dit.step preempted 2")
        await asyncio.sleep(DIT_S / 3)  # chunk 2 made again, bound to L, runs
        rig.ws.send(encode(ControlRequest(session_id="d", event_id=3, keys=["a"])))
        rig.ws.send(encode(ControlRequest(session_id="d", event_id=4, keys=["d"])))

    replies, log = _w_then_l(then=change_twice_while_it_is_made_again, until=4, release_id=5)
    assert log.count("dit.preempt 2") == 1 and log.count("dit.step preempted 2") == 1
    assert replies[2].event_id == 2 and replies[3].event_id == 4  # D: the keys held when chunk 3 started
    _expected(replies, {1: {"w"}, 2: {"l"}, 3: {"a"}, 4: {"d"}})


def test_without_preempt_a_change_waits_for_the_next_chunk():
    replies, log = _w_then_l(preempt=False)
    assert not any("preempt" in e for e in log)
    assert [r.event_id for r in replies[:4]] == [1, 1, 1, 2]
