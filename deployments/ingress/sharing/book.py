"""WorldBook: the shared worlds of the application, as the WorldHub (hub.py) keeps them.

Plain bookkeeping, no Ray and no awaits (the hub serialises every call on its event loop):
who owns a world (the principal and the stream it shares), its token, its viewers, the last
few items viewers get (`WorldItem`: a chunk, or a notice) under one sequence number, and the
limits (viewers per world and per principal, joins per address and minute).

A world is one share of one incarnation of one session (the owner's stream key): `unshare`,
the session's end, or an owner that neither resumes within its grace nor is heard for
`owner_timeout_s` ends it. Its token then stops opening anything (it is forgotten with the
world; a new share makes a new world and a new token). An ended world keeps its last items for
`ENDED_KEEP_S`, so that every feed reads its `ended` notice.
"""
from __future__ import annotations

import hmac
import secrets
import time
from collections import deque
from dataclasses import dataclass, field, replace
from typing import Optional

from deployments.errors import Busy, ReplicaError
from deployments.ingress.sharing.policy import OWNER, ControlPolicy, Forbidden, PlayerInputs
from deployments.share_args import SharingArgs
from media.reassembly import split_init
from protocol.errors import ErrorCode

TOKEN_BYTES = 24  # secrets.token_urlsafe: 192 bits
WORLD_ID_BYTES = 12  # 96 bits: an id, not a secret
ENDED_KEEP_S = 30.0
MAX_NOTICES_KEPT = 16
JOIN_WINDOW_S = 60.0


class WatchRefused(ReplicaError):
    """No world answers this id and token (never shared, revoked, ended, or another principal's)."""

    code = ErrorCode.UNAUTHORIZED


class NotShared(ReplicaError):
    """The owner's stream has no world here (or the world is not this principal's)."""

    code = ErrorCode.BAD_MESSAGE


class NoSuchViewer(ReplicaError):
    """The owner named a viewer that does not watch its world (any more)."""

    code = ErrorCode.BAD_MESSAGE


@dataclass(frozen=True, slots=True)
class WorldChunk:
    """One chunk as the owner sent it (the same fMP4 bytes), without the owner's private fields."""

    chunk_id: int
    video: bytes
    num_frames: int
    resolution: tuple[int, int]
    fps: int
    mime_type: Optional[str]
    digest: str  # of `video`: a chunk sent again (a resume's replay) is published once
    event_id: Optional[int] = None  # the event id of the key state that made it (policy.py `chunk_keys`)
    player: Optional[str] = None  # whose input made it: `owner`, a player's viewer id, `crowd`
    voters: Optional[tuple[str, ...]] = None  # a `crowd` chunk: the players whose votes made it (policy.py)


@dataclass(frozen=True, slots=True)
class WorldItem:
    """What viewers get, in `seq` order: a chunk, or a notice (`event`, `viewers`, `reason`;
    `controls`: `holder`, `players`, `director`; `kicked`: `target`, the viewer kicked)."""

    seq: int
    chunk: Optional[WorldChunk] = None
    event: Optional[str] = None
    viewers: int = 0
    reason: Optional[str] = None
    holder: Optional[str] = None
    players: tuple[str, ...] = ()
    director: Optional[str] = None
    target: Optional[str] = None
    prompt: Optional[str] = None  # with `prompt` (only a `show_prompt` share sends one)


@dataclass(frozen=True, slots=True)
class Joined:
    """A viewer's admission: its id, the world's init segment (None until chunk 0 came), the seq
    to read after (its first item is the world's last chunk, or the oldest of its catch-up)
    and the world's state."""

    viewer_id: str
    init: Optional[bytes]
    after_seq: int
    viewers: int
    controls: str
    last_chunk_id: Optional[int]  # the first chunk it gets (with catch-up: the oldest of them)
    holder: Optional[str] = None  # who holds the controls now (`controls` notice)
    players: tuple[str, ...] = ()
    kept_after: int = 0  # the seq before the oldest chunk the hub keeps: a new feed reads from there
    notices_after: int = 0  # the notices it gets: those after this seq (its own `viewers` the first)
    paused: bool = False
    prompt: Optional[str] = None  # only a `show_prompt` share has one


@dataclass
class World:
    world_id: str
    token: str
    owner: str
    stream_key: str
    audience: str
    controls: str
    heard: float
    init: Optional[bytes] = None
    seq: int = 0
    items: deque[WorldItem] = field(default_factory=deque)
    viewers: dict[str, str] = field(default_factory=dict)  # viewer id -> principal
    away_until: Optional[float] = None  # the owner's socket dropped; its session is parked until then
    ended: Optional[str] = None
    ended_at: float = 0.0
    policy: Optional[ControlPolicy] = None  # its players and who drives (policy.py)
    kicked: set[str] = field(default_factory=set)  # principals the owner kicked: refused from now on
    paused: bool = False  # the owner's drive is paused (notices `paused`, `resumed`)
    prompt: Optional[str] = None  # the prompt it attends to: only a `show_prompt` share has one


class WorldBook:
    """Every shared world of the application (module doc)."""

    def __init__(self, args: SharingArgs) -> None:
        self._args = args
        self._worlds: dict[str, World] = {}
        self._by_stream: dict[str, str] = {}  # the owner's stream key -> its live world
        self._views: dict[str, int] = {}  # principal -> worlds it watches now
        self._joins: dict[str, deque[float]] = {}  # address -> its joins in the last minute

    def __len__(self) -> int:
        return sum(w.ended is None for w in self._worlds.values())

    def world(self, world_id: str) -> Optional[World]:
        return self._worlds.get(world_id)

    # ---- the owner's side ----

    def share(self, owner: str, stream_key: str, audience: str, controls: str, now: float,
              init: Optional[bytes] = None, need_init: bool = False, current: Optional[WorldChunk] = None,
              prompt: Optional[str] = None) -> World:
        """The stream's world (the one it has, else a new one with a new token); `init`: the
        session's init segment when the owner's side has it. `need_init`: the session's chunk 0
        was sent on another socket; without a world that has its init segment, NotShared.
        `current`: the last chunk the owner was sent, a new world's first (late joiners start there).
        `prompt`: the prompt it attends to now, when the share shows it (None: it is not shown)."""
        world = self.live(stream_key, owner)
        if world is None and need_init and init is None:
            raise NotShared("this session's first chunk was sent on an earlier socket and it was not shared then: "
                            "the server cannot give viewers its init segment; share a session from the socket that "
                            "started it (or share it before its socket drops)")
        if world is None:
            world = World(world_id=secrets.token_urlsafe(WORLD_ID_BYTES), token=secrets.token_urlsafe(TOKEN_BYTES),
                          owner=owner, stream_key=stream_key, audience=audience, controls=controls, heard=now,
                          policy=ControlPolicy(controls, self._args.turn_idle_s))
            self._worlds[world.world_id] = world
            self._by_stream[stream_key] = world.world_id
        if world.init is None and init is not None:
            world.init = init
        world.prompt = prompt
        if current is not None:
            self.publish(stream_key, current, now)
        return world

    def publish(self, stream_key: str, chunk: WorldChunk, now: float) -> bool:
        """Append a chunk the owner sent; False when the stream has no world (or sent it already)."""
        world = self.live(stream_key)
        if world is None:
            return False
        world.heard, world.away_until = now, None
        if any(i.chunk is not None and i.chunk.chunk_id == chunk.chunk_id and i.chunk.digest == chunk.digest
               for i in world.items):
            return False
        if chunk.video[4:8] == b"ftyp":
            world.init = split_init(chunk.video)[0]
        self._append(world, WorldItem(seq=world.seq + 1, chunk=chunk))
        return True

    def note(self, stream_key: str, event: str, now: float, prompt: Optional[str] = None) -> bool:
        """A notice of the owner's session, in its chunks' order: `prompt` (with the new prompt),
        `paused`, `resumed`; False when the stream has no world."""
        world = self.live(stream_key)
        if world is None:
            return False
        world.heard = now
        if event == "prompt":
            world.prompt = prompt
        elif event in ("paused", "resumed"):
            if world.paused == (event == "paused"):
                return True  # told already
            world.paused = event == "paused"
        self._append(world, WorldItem(seq=world.seq + 1, event=event, viewers=len(world.viewers), prompt=prompt))
        return True

    def heard(self, stream_key: str, now: float) -> bool:
        world = self.live(stream_key)
        if world is not None:
            world.heard = now
        return world is not None

    def away(self, stream_key: str, until: float) -> Optional[World]:
        """The owner's socket dropped and its session is parked until `until`: viewers are told."""
        world = self.live(stream_key)
        if world is not None and world.away_until is None:
            world.away_until = until
            self._notice(world, "owner_reconnecting")
        return world

    def back(self, stream_key: str, owner: str, now: float) -> Optional[World]:
        """The owner resumed the session on a new socket: its world goes on."""
        world = self.live(stream_key, owner)
        if world is not None:
            world.heard = now
            if world.away_until is not None:
                world.away_until = None
                self._notice(world, "owner_back")
        return world

    def end(self, stream_key: str, reason: str, now: float, owner: Optional[str] = None) -> Optional[World]:
        """End the stream's world (`owner`: only if it is this principal's): token forgotten, viewers told."""
        world = self.live(stream_key, owner)
        if world is not None:
            self._end(world, reason, now)
        return world

    # ---- the viewers' side ----

    def join(self, world_id: str, token: str, principal: str, address: str, now: float, catch_up: int = 0) -> Joined:
        """Admit a viewer (WatchRefused, Busy): it starts at the world's last chunk, or with
        `catch_up` K at the oldest of its last K (at most `hub_chunks`, what the hub keeps)."""
        world = self._worlds.get(world_id)
        if world is None or world.ended is not None or not hmac.compare_digest(world.token.encode(), token.encode()) \
                or (world.audience == "principal" and principal != world.owner):
            raise WatchRefused("no shared world answers this world_id and watch_token (never shared, unshared, "
                               "ended, or shared with its owner's key only)")
        if principal in world.kicked:
            raise Forbidden("the owner of this world removed this key (or address) from it")
        joins = self._joins.setdefault(address, deque())
        while joins and joins[0] <= now - JOIN_WINDOW_S:
            joins.popleft()
        if len(joins) >= self._args.joins_per_minute:
            raise Busy(f"this address joined {len(joins)} worlds within a minute, the most it may",
                       retry_after_s=round(joins[0] + JOIN_WINDOW_S - now, 3))
        if len(world.viewers) >= self._args.max_viewers:
            raise Busy(f"this world has {len(world.viewers)} viewers, the most it may have", retry_after_s=5.0)
        if self._views.get(principal, 0) >= self._args.max_views_per_principal:
            raise Busy(f"this key (or address) holds {self._views[principal]} viewer sockets, the most it may",
                       retry_after_s=5.0)
        joins.append(now)
        viewer_id = secrets.token_hex(8)
        world.viewers[viewer_id] = principal
        world.policy.viewers_changed()  # the owner's side lists the viewers (inbox.py)
        self._views[principal] = self._views.get(principal, 0) + 1
        notices_after = world.seq
        self._notice(world, "viewers")
        kept = [i for i in world.items if i.chunk is not None]
        first = kept[-max(1, min(catch_up, self._args.hub_chunks)):] if kept else []
        return Joined(viewer_id=viewer_id, init=world.init, after_seq=first[0].seq - 1 if first else notices_after,
                      viewers=len(world.viewers), controls=world.controls,
                      last_chunk_id=first[0].chunk.chunk_id if first else None,
                      holder=None if world.controls == "crowd" else (world.policy.holder or OWNER),
                      players=tuple(world.policy.players),
                      kept_after=kept[0].seq - 1 if kept else notices_after, notices_after=notices_after,
                      paused=world.paused, prompt=world.prompt)

    def may_fork(self, world_id: str, token: str, principal: str) -> World:
        """The live world `principal` may fork with `token` (as `join` checks it: the token, the
        audience and the owner's kicks; no viewer limit, the fork is a session); WatchRefused
        otherwise."""
        world = self._worlds.get(world_id)
        if world is None or world.ended is not None or not hmac.compare_digest(world.token.encode(), token.encode()) \
                or (world.audience == "principal" and principal != world.owner) or principal in world.kicked:
            raise WatchRefused("no shared world answers this world_id and watch_token (never shared, unshared, "
                               "ended, or shared with its owner's key only)")
        return world

    def leave(self, world_id: str, viewer_id: str, now: Optional[float] = None) -> None:
        world = self._worlds.get(world_id)
        principal = world.viewers.pop(viewer_id, None) if world is not None else None
        if principal is None:
            return
        if world.policy.revoke(viewer_id, now_s() if now is None else now) and world.ended is None:
            self._controls_notice(world)
        world.policy.viewers_changed()
        left = self._views.get(principal, 1) - 1
        if left:
            self._views[principal] = left
        else:
            self._views.pop(principal, None)
        if world.ended is None:
            self._notice(world, "viewers")

    def after(self, world_id: str, seq: int) -> tuple[list[WorldItem], int, bool]:
        """The items after `seq` the world still keeps, its latest seq, and whether it is gone
        (ended, or unknown: its `ended` notice is among the items while it is kept)."""
        world = self._worlds.get(world_id)
        if world is None:
            return [], seq, True
        return [i for i in world.items if i.seq > seq], world.seq, world.ended is not None

    # ---- players (policy.py): the viewers' requests, then the owner's ----

    def ask(self, world_id: str, viewer_id: str, now: float) -> None:
        world = self._watched(world_id, viewer_id)
        if world.policy.ask(viewer_id, now):
            self._controls_notice(world)

    def control(self, world_id: str, viewer_id: str, keys: tuple[str, ...], event_id: Optional[int],
                now: float) -> bool:
        """A player's key state; True when it changed what the owner's side reads (`inputs`)."""
        return self._watched(world_id, viewer_id).policy.control(viewer_id, keys, event_id, now)

    def prompt(self, world_id: str, viewer_id: str, prompt: str) -> None:
        """The director's prompt steering (Forbidden from anyone else)."""
        self._watched(world_id, viewer_id).policy.steer(viewer_id, prompt)

    def pass_controls(self, world_id: str, by: Optional[str], to: Optional[str], now: float) -> None:
        """`by` (a viewer id; None: the owner, checked by the caller) passes the controls to `to`."""
        world = self._worlds.get(world_id)
        if world is None or world.ended is not None or (by is not None and by not in world.viewers):
            raise Forbidden("this socket watches no live world")
        if to is not None and to not in world.viewers:
            raise NoSuchViewer("no viewer of this world has that viewer_id (any more)")
        if world.policy.pass_to(by, to, now):
            self._controls_notice(world)

    def owners(self, stream_key: str, owner: str, action: str, viewer_id: Optional[str], now: float) -> World:
        """The owner's `grant` / `direct` / `revoke` / `kick` / `pass` of a viewer of its world."""
        world = self.live(stream_key, owner)
        if world is None:
            raise NotShared("this session is not shared (share it first)")
        if action == "pass":
            self.pass_controls(world.world_id, None, viewer_id, now)
            return world
        principal = world.viewers.get(viewer_id or "")
        if principal is None:
            raise NoSuchViewer("no viewer of this world has that viewer_id (any more)")
        if action == "kick":
            world.kicked.add(principal)
            self._notice(world, "kicked", "the owner removed this viewer", target=viewer_id)
            self.leave(world.world_id, viewer_id, now)  # its socket closes on the notice; its place is free now
            return world
        changed = world.policy.revoke(viewer_id, now) if action == "revoke" else \
            world.policy.grant(viewer_id, director=action == "direct")
        if changed:
            self._controls_notice(world)
        return world

    def inputs(self, stream_key: str) -> Optional[PlayerInputs]:
        """What the owner's side of the stream's world reads per chunk; None: no world."""
        world = self.live(stream_key)
        return None if world is None else replace(world.policy.inputs(), viewers=tuple(world.viewers),
                                                  world_id=world.world_id)

    def _watched(self, world_id: str, viewer_id: str) -> World:
        world = self._worlds.get(world_id)
        if world is None or world.ended is not None or viewer_id not in world.viewers:
            raise Forbidden("this socket watches no live world")
        return world

    # ---- time ----

    def tick(self, now: float) -> list[str]:
        """Time passed for the players (policy.py `tick`): the worlds whose controls changed."""
        changed = [w for w in self._worlds.values() if w.ended is None and w.policy.tick(now)]
        for world in changed:
            self._controls_notice(world)
        return [w.world_id for w in changed]

    def sweep(self, now: float) -> list[World]:
        """End the worlds whose owner is gone (not back within its grace, or not heard); forget
        those that ended long enough ago; trim the join records. The worlds it ended."""
        ended = []
        for world in list(self._worlds.values()):
            if world.ended is None:
                if world.away_until is not None and now > world.away_until:
                    self._end(world, "the owner did not come back", now)
                    ended.append(world)
                elif world.away_until is None and now - world.heard > self._args.owner_timeout_s:
                    self._end(world, "the owner's server was lost", now)
                    ended.append(world)
            elif now - world.ended_at > ENDED_KEEP_S:
                for viewer_id in list(world.viewers):
                    self.leave(world.world_id, viewer_id, now)
                del self._worlds[world.world_id]
        for address in [a for a, j in self._joins.items() if not j or j[-1] <= now - JOIN_WINDOW_S]:
            del self._joins[address]
        return ended

    # ---- internals ----

    def live(self, stream_key: str, owner: Optional[str] = None) -> Optional[World]:
        world = self._worlds.get(self._by_stream.get(stream_key, ""))
        if world is None or world.ended is not None or (owner is not None and world.owner != owner):
            return None
        return world

    def _end(self, world: World, reason: str, now: float) -> None:
        world.ended, world.ended_at = reason, now
        self._by_stream.pop(world.stream_key, None)
        world.token = secrets.token_urlsafe(TOKEN_BYTES)  # the shared one opens nothing from now on
        self._notice(world, "ended", reason)

    def _notice(self, world: World, event: str, reason: Optional[str] = None, **fields) -> None:
        self._append(world, WorldItem(seq=world.seq + 1, event=event, viewers=len(world.viewers), reason=reason,
                                      **fields))

    def _controls_notice(self, world: World) -> None:
        policy = world.policy
        holder = None if policy.controls == "crowd" else (policy.holder or OWNER)
        self._notice(world, "controls", holder=holder, players=tuple(policy.players), director=policy.director)

    def _append(self, world: World, item: WorldItem) -> None:
        world.seq = item.seq
        world.items.append(item)
        chunks = sum(i.chunk is not None for i in world.items)
        while chunks > self._args.hub_chunks or len(world.items) > self._args.hub_chunks + MAX_NOTICES_KEPT:
            dropped = world.items.popleft()
            chunks -= dropped.chunk is not None


def now_s() -> float:
    return time.monotonic()
