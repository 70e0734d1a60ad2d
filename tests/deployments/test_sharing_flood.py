"""A viewer socket that floods the watch route, through the real app (/resume: two ingress
replicas, the WorldHub): its messages over `sharing.viewer_messages_per_s` are answered `busy`
and it is closed (1008) for its rate, while the owner's chunks keep coming and another viewer
gets each of them. The bound itself (fake clock): test_viewer_pace.py."""
from __future__ import annotations

import asyncio

import websockets

from deployments.share_args import SharingArgs
from protocol.codec import encode
from protocol.errors import ErrorCode
from protocol.messages import AskControlsRequest, ControlRequest, ErrorReply, FrameReply
from world_viewers import Viewer, share

FLOOD = 2000  # controls sent as fast as the socket takes them (the default bound: 30 a second, 60 at once)
CHUNKS = 2  # the owner's chunks made while it floods (the example has 3)


async def flood(viewer: Viewer, world_id: str) -> tuple[list, int | None, str | None]:
    """Send FLOOD valid controls, then read until the server closes: (replies, close code, reason)."""
    try:
        for i in range(FLOOD):
            await viewer.ws.send(encode(ControlRequest(session_id=world_id, event_id=i, keys=("w",))))
    except websockets.ConnectionClosed:
        pass
    try:
        while True:
            await viewer.next(30)
    except websockets.ConnectionClosed as e:
        return viewer.notices, e.rcvd.code if e.rcvd else None, e.rcvd.reason if e.rcvd else None


def test_a_flooding_viewer_gets_busy_then_is_closed_while_the_owner_and_another_viewer_go_on(
        resume_server, resume_connect, example):
    async def go():
        async with resume_connect() as owner:
            await owner.infer("f1", example, 0, first=True)
            first = await owner.recv()
            shared = await share(owner, "f1", controls="crowd")
            flooder, _ = await Viewer.open(resume_server, shared.world_id, shared.watch_token)
            other, _ = await Viewer.open(resume_server, shared.world_id, shared.watch_token)
            await flooder.ws.send(encode(AskControlsRequest(session_id=shared.world_id)))
            await flooder.event("controls")  # a player: its controls are taken (below the bound)

            async def drive() -> list:
                mine = []
                for k in range(1, CHUNKS + 1):
                    await owner.infer("f1", example, k, first=False)
                    mine.append(await owner.recv())
                return mine

            (answers, code, reason), mine = await asyncio.gather(flood(flooder, shared.world_id), drive())
            theirs = [await other.frame()]
            while theirs[-1].chunk_id < CHUNKS:
                theirs.append(await other.frame())
            await other.ws.close()
            await owner.reset("f1")
        return first, answers, code, reason, mine, theirs

    first, answers, code, reason, mine, theirs = asyncio.run(go())
    assert isinstance(first, FrameReply)
    busy = [a for a in answers if isinstance(a, ErrorReply)]
    assert busy and all(a.code is ErrorCode.BUSY and a.retry_after_s and a.retry_after_s > 0 for a in busy), busy
    # closed after its strikes (MAX_STRIKES, a few forgiven meanwhile), long before FLOOD; a viewer's
    # queue keeps its last 16 notices (feed.py), so fewer may arrive than were answered
    assert len(busy) < 100
    assert code == 1008
    assert reason == f"more than {SharingArgs().viewer_messages_per_s:g} messages per second; slow down"
    assert [r.chunk_id for r in mine] == list(range(1, CHUNKS + 1))  # the owner's chunks kept coming
    assert all(isinstance(r, FrameReply) for r in mine)
    assert [(r.chunk_id, r.video) for r in theirs if r.chunk_id > 0] == [(r.chunk_id, r.video) for r in mine]
