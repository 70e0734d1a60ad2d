"""WorldHub: the application's shared worlds (one replica, like the waiting room), asked by
every ingress replica.

The owner's ingress replica publishes each chunk its owner was sent (`publish`, one call at a
time per world, so in order); every ingress replica with viewers of a world runs one feed
(feed.py) that long-polls `poll` and fans the items out to its own viewers. So a chunk crosses
Ray once to the hub and once to each ingress replica with viewers, whatever their number, and a
viewer on another replica gets it one hub call after the owner's send. Every call is
bookkeeping (book.py) and answers at once, except `poll`, which returns when the world has
items after the caller's or at its timeout.

Its state is the worlds: when its replica dies, Serve starts another with an empty book; the
owners' next publish finds no world (PROTOCOL.md: share again) and the viewers' feeds find it
gone (`ended`).
"""
from __future__ import annotations

import asyncio
from typing import Any, Optional

from ray import serve

from deployments.log import get_log, log_routine_access_at_debug
from deployments.share_args import SharingArgs
from deployments.ingress.sharing.book import Joined, WorldBook, WorldChunk, WorldItem, now_s
from deployments.ingress.sharing.policy import PlayerInputs
from deployments.ingress.sharing.fork_asks import ForkAsks

SWEEP_PERIOD_S = 1.0
MAX_ONGOING = 4096  # long polls of every feed, the owners' publishes: bookkeeping only


class Changes:
    """Per world, the event of its next item: `poll` waits on it."""

    def __init__(self) -> None:
        self._events: dict[str, asyncio.Event] = {}

    def bump(self, world_id: str) -> None:
        event = self._events.pop(world_id, None)
        if event is not None:
            event.set()

    async def wait(self, world_id: str, timeout_s: float) -> None:
        event = self._events.setdefault(world_id, asyncio.Event())
        try:
            await asyncio.wait_for(event.wait(), timeout_s)
        except asyncio.TimeoutError:
            pass


@serve.deployment(max_ongoing_requests=MAX_ONGOING)
class WorldHub:
    """The shared worlds (module doc, book.py)."""

    def __init__(self, args: SharingArgs) -> None:
        log_routine_access_at_debug()  # a CALL line per long poll: DEBUG
        self._book = WorldBook(args)
        self._changes = Changes()
        self._forks = ForkAsks()  # forks of the worlds' heads (fork_asks.py)
        self._log = get_log("worlds")
        self._sweeper = asyncio.get_event_loop().create_task(self._sweep_loop())

    # ---- the owner's ingress replica ----

    async def share(self, owner: str, stream_key: str, audience: str, controls: str, init: Optional[bytes] = None,
                    need_init: bool = False, current: Optional[WorldChunk] = None,
                    prompt: Optional[str] = None) -> tuple[str, str]:
        """(world_id, watch_token) of the stream's world, made now if it has none (book.py `share`)."""
        world = self._book.share(owner, stream_key, audience, controls, now_s(), init, need_init, current, prompt)
        self._changes.bump(world.world_id)
        self._log.info("world shared", fields={"world": world.world_id, "audience": audience})
        return world.world_id, world.token

    async def publish(self, stream_key: str, chunk: WorldChunk) -> bool:
        world = self._book.world(self._world_of(stream_key) or "")
        if self._book.publish(stream_key, chunk, now_s()) and world is not None:
            self._changes.bump(world.world_id)
        return world is not None

    async def note(self, stream_key: str, event: str, prompt: Optional[str] = None) -> bool:
        """A notice of the owner's session (`prompt`, `paused`, `resumed`; book.py `note`)."""
        world = self._book.live(stream_key)
        if self._book.note(stream_key, event, now_s(), prompt) and world is not None:
            self._changes.bump(world.world_id)
        return world is not None

    async def heard(self, stream_key: str) -> bool:
        """The owner's keep-alive: False when the stream has no world (any more)."""
        return self._book.heard(stream_key, now_s())

    async def away(self, stream_key: str, grace_s: float) -> None:
        self._bump(self._book.away(stream_key, now_s() + grace_s))

    async def back(self, stream_key: str, owner: str) -> Optional[str]:
        """The world of a resumed stream (its world_id), None when it has none."""
        world = self._book.back(stream_key, owner, now_s())
        self._bump(world)
        return None if world is None else world.world_id

    async def shown_prompt(self, stream_key: str) -> Optional[str]:
        """The prompt the stream's world shows its viewers (None: not a `show_prompt` share, or no world)."""
        world = self._book.live(stream_key)
        return None if world is None else world.prompt

    async def end(self, stream_key: str, reason: str, owner: Optional[str] = None) -> Optional[str]:
        world = self._book.end(stream_key, reason, now_s(), owner)
        self._bump(world)
        self._forks.forget(stream_key)
        if world is not None:
            self._changes.bump(_inputs(world.world_id))
        if world is not None:
            self._log.info("world ended", fields={"world": world.world_id, "reason": reason})
        return None if world is None else world.world_id

    # ---- the viewers' ingress replicas ----

    async def join(self, world_id: str, token: str, principal: str, address: str, catch_up: int = 0) -> Joined:
        """Admit a viewer: WatchRefused (unauthorized) or Busy (a limit)."""
        joined = self._book.join(world_id, token, principal, address, now_s(), catch_up)
        self._changes.bump(world_id)
        self._changes.bump(_inputs(world_id))  # the owner's side lists its viewers
        return joined

    async def leave(self, world_id: str, viewer_id: str) -> None:
        self._book.leave(world_id, viewer_id)
        self._changes.bump(world_id)
        self._changes.bump(_inputs(world_id))  # a player that left drives no more

    async def poll(self, world_id: str, after_seq: int, timeout_s: float) -> tuple[list[WorldItem], int, bool]:
        """The world's items after `after_seq` (waits up to `timeout_s` for one), its latest seq,
        and whether it is gone (book.py `after`)."""
        items, seq, gone = self._book.after(world_id, after_seq)
        if not items and not gone:
            await self._changes.wait(world_id, timeout_s)
            items, seq, gone = self._book.after(world_id, after_seq)
        return items, seq, gone

    # ---- players (policy.py): the owner's side reads their inputs, the viewers' sides send them ----

    async def owners(self, stream_key: str, owner: str, action: str, viewer_id: Optional[str]) -> PlayerInputs:
        """The owner's grant / direct / revoke / kick / pass: the world's roles and viewers now
        (book.py `inputs`)."""
        world = self._book.owners(stream_key, owner, action, viewer_id, now_s())
        self._changes.bump(world.world_id)
        self._changes.bump(_inputs(world.world_id))
        return self._book.inputs(stream_key)

    async def ask(self, world_id: str, viewer_id: str) -> None:
        self._book.ask(world_id, viewer_id, now_s())
        self._changes.bump(world_id)
        self._changes.bump(_inputs(world_id))

    async def pass_controls(self, world_id: str, viewer_id: str, to: Optional[str]) -> None:
        self._book.pass_controls(world_id, viewer_id, to, now_s())
        self._changes.bump(world_id)
        self._changes.bump(_inputs(world_id))

    async def control(self, world_id: str, viewer_id: str, keys: tuple[str, ...], event_id: Optional[int]) -> None:
        """A player's key state (Forbidden unless it may drive now): the owner's side reads it."""
        if self._book.control(world_id, viewer_id, keys, event_id, now_s()):
            self._changes.bump(_inputs(world_id))

    async def prompt(self, world_id: str, viewer_id: str, prompt: str) -> None:
        """The director's prompt steering: the owner's side takes it for its next chunk."""
        self._book.prompt(world_id, viewer_id, prompt)
        self._changes.bump(_inputs(world_id))

    async def inputs(self, stream_key: str, after_version: int, timeout_s: float) -> Optional[PlayerInputs]:
        """The players' inputs of the stream's world once their version passes `after_version`
        (waits up to `timeout_s`); None: the stream has no world (any more)."""
        inputs = self._book.inputs(stream_key)
        if inputs is not None and inputs.version <= after_version:
            await self._changes.wait(_inputs(self._world_of(stream_key) or ""), timeout_s)
            inputs = self._book.inputs(stream_key)
        return inputs
    # ---- a fork of a world (fork_asks.py, fork.py) ----

    async def fork_head(self, world_id: str, token: str, principal: str,
                        timeout_s: float) -> tuple[Any, Optional[bytes]]:
        """(the owner side's answer, the world's init segment) to a fork of the world's head by
        `principal`: WatchRefused (the token, the audience), Busy (no answer in time)."""
        world = self._book.may_fork(world_id, token, principal)
        return await self._forks.ask(world.stream_key, timeout_s), world.init

    async def fork_wanted(self, stream_key: str, timeout_s: float) -> Optional[list[str]]:
        """The fork asks of the owner's stream (waits up to `timeout_s`); None: it has no world."""
        if self._book.live(stream_key) is None:
            return None
        return await self._forks.wanted(stream_key, timeout_s)

    async def fork_answer(self, ask_id: str, answer: Any) -> bool:
        return self._forks.answer(ask_id, answer)

    async def stats(self) -> dict[str, int]:
        return {"worlds": len(self._book)}

    # ---- internals ----

    def _world_of(self, stream_key: str) -> Optional[str]:
        world = self._book.live(stream_key)
        return None if world is None else world.world_id

    def _bump(self, world) -> None:
        if world is not None:
            self._changes.bump(world.world_id)

    async def _sweep_loop(self) -> None:
        while True:
            await asyncio.sleep(SWEEP_PERIOD_S)
            for world_id in self._book.tick(now_s()):  # an idle holder lost its turn, a silent player stopped voting
                self._changes.bump(world_id)
                self._changes.bump(_inputs(world_id))
            for world in self._book.sweep(now_s()):
                self._changes.bump(world.world_id)
                self._changes.bump(_inputs(world.world_id))
                self._log.info("world ended", fields={"world": world.world_id, "reason": world.ended})


def _inputs(world_id: str) -> str:
    """The `Changes` key of a world's player inputs (the owner's side long-polls them)."""
    return f"{world_id}/inputs"
