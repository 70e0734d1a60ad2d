"""Viewers: the watch route (`/v1/realtime/world/watch`, PROTOCOL.md "Shared worlds").

A viewer's socket is admitted by the camera route's code (guards/admission.py: origin, API key
when auth is on, unless `sharing.anonymous_viewers` lets one without a key watch as its address;
connection caps), then sends `watch {world_id, watch_token, catch_up}` (the token travels in a message,
never in the URL) within `FIRST_MESSAGE_S`. The hub admits it (token, audience, limits:
book.py `join`), it gets `watching`, then the world's frame replies and notices from this
replica's feed of the world (feed.py). A viewer has no session: what it sends after goes
through `Playing` (playing.py): a player's `ask_controls`, `control`, `pass_controls`,
`prompt` to the hub's policy; anything else (infer, rewind, prompt steering...) is refused
(`forbidden`, `bad_message` for what does not decode) and changes nothing; beyond
`MAX_REFUSED` refusals the socket is closed (1008). Its messages are counted first against
its rate bound (`sharing.viewer_messages_per_s`, pace.py): one over it is answered `busy`
(`retry_after_s`) and not read; a socket that keeps flooding is closed (1008). The world's
end sends `ended` and closes the socket (1000); the owner's `kick` sends `kicked` and closes
it (1008); the socket's end, any way, leaves the world and frees its place.
"""
from __future__ import annotations

import asyncio
import uuid
from typing import Optional

from fastapi import WebSocket, WebSocketDisconnect
from ray.serve.handle import DeploymentHandle
from starlette.websockets import WebSocketState

from deployments.config import AppArgs
from deployments.errors import ReplicaError
from deployments.ingress.detached import detach, settle
from deployments.ingress.guards.admission import POLICY_VIOLATION, TRY_AGAIN_LATER, Admission
from deployments.ingress.sharing.book import Joined
from deployments.ingress.sharing.feed import Feeds, ViewerQueue
from deployments.ingress.sharing.metrics import WorldMetrics
from deployments.ingress.sharing.pace import Pace
from deployments.ingress.sharing.playing import Playing
from deployments.log import get_log
from deployments.metrics import IngressMetrics
from protocol.codec import encode, unpack, validated
from protocol.errors import ErrorCode, ProtocolError
from protocol.limits import Limits
from protocol.messages import ErrorReply
from protocol.sharing import WatchRequest, Watching

FIRST_MESSAGE_S = 10.0
MAX_REFUSED = 16
HUB_TIMEOUT_S = 10.0
NORMAL_CLOSURE = 1000


def watch_request(data: Optional[bytes], limits: Limits) -> WatchRequest:
    """A viewer's first frame -> its `watch` request; ProtocolError otherwise."""
    if data is None:
        raise ProtocolError(ErrorCode.BAD_MESSAGE, "send binary frames holding one msgpack map, not text")
    obj = unpack(data, limits)
    if not isinstance(obj, dict) or obj.get("endpoint") != "watch":
        raise ProtocolError(ErrorCode.BAD_MESSAGE, "the first message on the watch route is `watch` with "
                                                   "`world_id` and `watch_token`")
    return validated(WatchRequest, obj, limits)


class Viewers:
    """Serves the watch route of one ingress replica (module doc)."""

    def __init__(self, hub: DeploymentHandle, admission: Admission, args: AppArgs, limits: Limits,
                 metrics: IngressMetrics, debug: Optional[dict] = None) -> None:
        """`admission`: the replica's, every socket route's (guards/admission.py); `debug`: the
        handshake's debug fields (the ingress replica), sent in `watching`."""
        self._hub = hub
        self._debug = debug
        self._admission = admission
        self._args = args
        self._limits = limits
        self._metrics = metrics
        self._feeds = Feeds(hub, args.sharing.hub_chunks)
        self._world_metrics = WorldMetrics()
        self.watching = 0  # viewers on this replica now

    async def serve(self, ws: WebSocket) -> None:
        # origin, API key (or none: sharing.anonymous_viewers), caps: as the camera route (guards/admission.py)
        admitted = await self._admission.admit(ws, anonymous=self._args.sharing.anonymous_viewers)
        if admitted is None:
            return
        key_id, client = admitted.key_id, admitted.client
        try:
            await self._watch(ws, f"key:{key_id}" if key_id is not None else f"addr:{client}", client)
        except WebSocketDisconnect:
            pass
        finally:
            self._admission.release(admitted)

    async def _watch(self, ws: WebSocket, principal: str, client: str) -> None:
        try:
            async with asyncio.timeout(FIRST_MESSAGE_S):
                msg = await ws.receive()
        except TimeoutError:
            await ws.close(code=POLICY_VIOLATION, reason="no `watch` message in time")
            return
        if msg["type"] == "websocket.disconnect":
            return
        try:
            req = watch_request(msg.get("bytes"), self._limits)
        except ProtocolError as e:
            await self._refuse(ws, e.code, e.message, POLICY_VIOLATION, "bad watch request")
            return
        ended, joined = await settle(self._hub.join.remote(req.world_id, req.watch_token, principal, client,
                                                           req.catch_up), HUB_TIMEOUT_S)
        if isinstance(joined, ReplicaError):
            busy = joined.code is ErrorCode.BUSY
            await self._refuse(ws, joined.code, joined.message, TRY_AGAIN_LATER if busy else POLICY_VIOLATION,
                               "refused", getattr(joined, "retry_after_s", None))
            return
        if not ended or not isinstance(joined, Joined):
            await self._refuse(ws, ErrorCode.BUSY, "the world hub did not answer; try again", TRY_AGAIN_LATER,
                               "hub unavailable", 5.0)
            return
        await self._follow(ws, req.world_id, joined, min(req.catch_up, self._args.sharing.hub_chunks))

    async def _follow(self, ws: WebSocket, world_id: str, joined: Joined, catch_up: int = 0) -> None:
        """Send the world to the viewer until either ends; then leave it (always: the hub frees its place)."""
        log = get_log("viewer", viewer=uuid.uuid4().hex[:8], world=world_id)

        async def send(data: bytes) -> None:
            await ws.send_bytes(data)
            self._world_metrics.fanout_bytes.inc(len(data))

        queue = ViewerQueue(world_id, send, max(self._args.sharing.viewer_queue_chunks, catch_up))
        queue.put_notice(encode(Watching(world_id=world_id, viewers=joined.viewers, controls=joined.controls,
                                         next_chunk_id=joined.last_chunk_id, viewer_id=joined.viewer_id,
                                         holder=joined.holder, players=list(joined.players), paused=joined.paused,
                                         prompt=joined.prompt, debug=self._debug)))  # first out
        queue.viewer_id = joined.viewer_id
        playing = Playing(self._hub, world_id, joined.viewer_id, self._limits,
                          lambda e: queue.put_notice(self._error(e.code, e.message, e.session_id)))
        pace = Pace(self._args.sharing)
        self._feeds.attach(world_id, joined, queue)
        self.watching += 1
        self._world_metrics.viewers.set(self.watching)
        try:
            while True:
                receive = asyncio.ensure_future(ws.receive())
                done, _ = await asyncio.wait({receive, queue.ended, queue.task}, return_when=asyncio.FIRST_COMPLETED)
                if receive not in done:
                    receive.cancel()
                    if queue.ended.done() and queue.kicked:  # the owner kicked it: its notice was sent
                        await ws.close(code=POLICY_VIOLATION, reason="removed by the world's owner")
                    elif queue.ended.done():  # the world ended: its notice was sent
                        await ws.close(code=NORMAL_CLOSURE, reason="the world ended")
                    return  # else the send task failed: the viewer is gone
                msg = receive.result()
                if msg["type"] == "websocket.disconnect":
                    return
                over = pace.take()  # the socket's message rate (pace.py), before the message is read
                if over is not None:
                    queue.put_notice(self._error(ErrorCode.BUSY, over.message, None, over.retry_after_s))
                    if over.close is not None:
                        await asyncio.sleep(0.1)  # its `busy` goes out first (best effort)
                        await ws.close(code=POLICY_VIOLATION, reason=over.close)
                        return
                    continue
                playing.handle(msg.get("bytes"))  # a player's request, or a refusal (playing.py)
                if playing.refused >= MAX_REFUSED:
                    await asyncio.sleep(0.1)  # the last refusal goes out first (best effort)
                    await ws.close(code=POLICY_VIOLATION, reason="too many refused requests")
                    return
        finally:
            playing.close()
            self.watching -= 1
            self._world_metrics.viewers.set(self.watching)
            self._feeds.detach(world_id, queue)
            if queue.skipped:
                self._world_metrics.skipped.inc(queue.skipped)
                log.info("viewer skipped chunks", fields={"skipped": queue.skipped, "sent": queue.sent})
            detach(settle(self._hub.leave.remote(world_id, joined.viewer_id), HUB_TIMEOUT_S),
                   name=f"leave-{joined.viewer_id}")

    def _error(self, code: ErrorCode, message: str, session_id: Optional[str] = None,
               retry_after_s: Optional[float] = None) -> bytes:
        self._metrics.count_error(code.value)
        return encode(ErrorReply(code=code, message=message, session_id=session_id,
                                 retry_after_s=retry_after_s if code is ErrorCode.BUSY else None))

    async def _refuse(self, ws: WebSocket, code: ErrorCode, message: str, close_code: int, reason: str,
                      retry_after_s: Optional[float] = None) -> None:
        if ws.application_state is WebSocketState.CONNECTED:
            await ws.send_bytes(self._error(code, message, None, retry_after_s if code is ErrorCode.BUSY else None))
            await ws.close(code=close_code, reason=reason)
