"""ControlPolicy: who drives a shared world (PROTOCOL.md "Players", issue 56).

Plain bookkeeping, no Ray, no awaits and no clock of its own (the caller passes `now`): the
WorldBook (book.py) keeps one per world in the hub, which serialises every call. It holds the
world's players (viewer ids, in the order they became players), who holds the controls, the
director, and each player's last key state; the owner's side (inbox.py) reads a `PlayerInputs`
snapshot of it and picks each chunk's keys with `chunk_keys`.

The share's `controls`:

* `owner`: only the owner drives. Players may be granted (a director steers the prompt), but a
  player's `control` is refused and viewers cannot ask.
* `turns`: one holder drives: the owner (`holder` None) or one player. A viewer that asks
  becomes a player waiting for a turn (in the order they asked). The holder passes the controls
  to a named player (the owner to any player, or back to itself). A player holding them that
  sends no `control` for `idle_s` (counted from when it got them) loses them to the next player
  waiting, or back to the owner when none waits. The owner holding them never loses them by
  idleness (its own controls do not go through the hub): it passes them. Only the holder's
  `control` is taken; another player's is refused.
* `crowd`: every player's held keys are merged per chunk (`crowd_keys`). Voters are the owner
  (when it sent a `control` for the session) and each player whose last `control` came within
  `idle_s` (a held key is a state: it counts until it goes stale; a player that never sent one,
  or went silent, does not vote). Each key is pressed when more than half of the voters hold
  it; a tie is decided by the owner's vote when the owner voted, else the key is not pressed.
  A crowd chunk names its `voters` (`crowd_voters`): the players that voted and held a key it
  pressed (or held none when it pressed none); a player outvoted on every key it held is not
  named.

The `PlayerInputs` snapshot also carries the players, and (book.py `inputs`) the world's id
and its viewers' ids: a viewer joining or leaving bumps the version too (`viewers_changed`), so
the owner's side can tell its socket who watches and plays (inbox.py `on_roles`).

A player keeps only its last key state (a flood of controls replaces one entry). Revoking a
player, its leaving or its kick removes it everywhere (holder, waiting, director, votes).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from camera.keys import KEY_NAMES
from deployments.errors import ReplicaError
from protocol.errors import ErrorCode

OWNER = "owner"  # the owner's name in `holder`-like fields of the wire (frame replies' `player`)
CROWD = "crowd"  # a crowd chunk's `player`: the keys merged from the votes


class Forbidden(ReplicaError):
    """The socket's role in the world does not allow the request (nothing was changed)."""

    code = ErrorCode.FORBIDDEN


KeyState = tuple[tuple[str, ...], Optional[int]]  # (keys held, the player's event_id)


@dataclass(frozen=True, slots=True)
class PlayerInputs:
    """What the owner's side needs per chunk: the mode, the holder (None: the owner), and the
    key states that count now (turns: the holder's; crowd: the voters'), each with its event id."""

    version: int
    controls: str
    holder: Optional[str]
    states: dict[str, KeyState]
    director: Optional[str] = None
    prompt_seq: int = 0  # the director's prompts so far: the owner's side takes each new one once
    prompt: Optional[str] = None  # the director's last prompt
    players: tuple[str, ...] = ()  # the world's players, in the order they became players
    viewers: tuple[str, ...] = ()  # every viewer's id, in the order they joined (book.py `inputs`)
    world_id: str = ""  # the world's id (book.py `inputs`)

    def roles(self) -> tuple:
        """What the owner's panel shows (inbox.py tells it when this changes): the mode, the
        holder, the players, the director and the viewers."""
        return self.controls, self.holder, self.players, self.director, self.viewers


@dataclass
class ControlPolicy:
    """One world's players and who drives (module doc)."""

    controls: str
    idle_s: float
    players: list[str] = field(default_factory=list)
    holder: Optional[str] = None  # turns: the player holding the controls (None: the owner)
    waiting: list[str] = field(default_factory=list)  # turns: players waiting for a turn, in order
    director: Optional[str] = None
    version: int = 0  # bumped on every change the owner's side must see
    prompt_seq: int = 0
    prompt: Optional[str] = None
    _states: dict[str, KeyState] = field(default_factory=dict)
    _last: dict[str, float] = field(default_factory=dict)  # player -> its last control (or when it got the controls)

    # ---- roles ----

    def ask(self, viewer: str, now: float) -> bool:
        """A viewer asks for the controls: it becomes a player (turns: waiting for a turn). True
        when something changed."""
        if self.controls == "owner":
            raise Forbidden("this world's controls are the owner's (`controls: owner`): nobody else drives")
        changed = self._add(viewer)
        if self.controls == "turns" and viewer != self.holder and viewer not in self.waiting:
            self.waiting.append(viewer)
            changed = True
        return self._changed(changed)

    def grant(self, viewer: str, director: bool = False) -> bool:
        """The owner makes a viewer a player (`director`: its prompt steering is taken too)."""
        changed = self._add(viewer)
        if director and self.director != viewer:
            self.director, changed = viewer, True
        return self._changed(changed)

    def revoke(self, viewer: str, now: float) -> bool:
        """The viewer is no player any more (revoked, kicked, or it left)."""
        if viewer not in self.players:
            return False
        self.players.remove(viewer)
        if viewer in self.waiting:
            self.waiting.remove(viewer)
        if self.director == viewer:
            self.director = None
        self._states.pop(viewer, None)
        self._last.pop(viewer, None)
        if self.holder == viewer:
            self._hand_to(self.waiting.pop(0) if self.waiting else None, now)
        return self._changed(True)

    def pass_to(self, by: Optional[str], to: Optional[str], now: float) -> bool:
        """`by` (a player, None: the owner) passes the controls to player `to` (None: the owner)."""
        if self.controls != "turns":
            raise Forbidden(f"the controls are passed only in `turns` (this world's are `{self.controls}`)")
        if by is not None and by != self.holder:
            raise Forbidden("only the holder of the controls (or the owner) passes them")
        if to is not None and to not in self.players:
            raise Forbidden("the controls go to a player of this world (a viewer asks, or the owner grants)")
        if to == self.holder:
            return False
        if to in self.waiting:
            self.waiting.remove(to)
        self._hand_to(to, now)
        return self._changed(True)

    # ---- input ----

    def control(self, viewer: str, keys: tuple[str, ...], event_id: Optional[int], now: float) -> bool:
        """A player's key state (the whole state). Forbidden unless it may drive now."""
        if viewer not in self.players:
            raise Forbidden("a viewer drives only as a player: ask for the controls (`ask_controls`), or the "
                            "owner grants them; nothing was changed")
        if self.controls == "owner":
            raise Forbidden("this world's controls are the owner's (`controls: owner`); nothing was changed")
        if self.controls == "turns" and viewer != self.holder:
            raise Forbidden("another player holds the controls: wait for your turn (or for the holder to pass "
                            "them); nothing was changed")
        self._last[viewer] = now
        if self._states.get(viewer) == (keys, event_id):
            return False
        self._states[viewer] = (keys, event_id)
        return self._changed(True)

    def steer(self, viewer: str, prompt: str) -> None:
        """The director's prompt: the world's next chunk attends to it."""
        if viewer != self.director:
            raise Forbidden("only the owner and the director it names steer the prompt; nothing was changed")
        self.prompt_seq, self.prompt = self.prompt_seq + 1, prompt
        self._changed(True)

    def viewers_changed(self) -> None:
        """A viewer joined or left (book.py): the owner's side reads the viewers too."""
        self._changed(True)

    def tick(self, now: float) -> bool:
        """Time passed: an idle holder loses the controls (turns); a silent player stops voting
        (crowd). True when something changed."""
        changed = False
        if self.controls == "turns" and self.holder is not None and \
                now - self._last.get(self.holder, now) > self.idle_s:
            self._hand_to(self.waiting.pop(0) if self.waiting else None, now)
            changed = True
        if self.controls == "crowd":
            for viewer in [v for v in self._states if now - self._last.get(v, now) > self.idle_s]:
                del self._states[viewer]
                changed = True
        return self._changed(changed)

    def inputs(self) -> PlayerInputs:
        if self.controls == "turns":
            states = {} if self.holder is None else {self.holder: self._states.get(self.holder, ((), None))}
        elif self.controls == "crowd":
            states = dict(self._states)
        else:
            states = {}
        return PlayerInputs(self.version, self.controls, self.holder, states, self.director, self.prompt_seq,
                            self.prompt, tuple(self.players))

    # ---- internals ----

    def _add(self, viewer: str) -> bool:
        if viewer in self.players:
            return False
        self.players.append(viewer)
        return True

    def _hand_to(self, viewer: Optional[str], now: float) -> None:
        if self.holder is not None:
            self._states.pop(self.holder, None)  # its keys stop driving with its turn
        self.holder = viewer
        if viewer is not None:
            self._last[viewer] = now  # its idle time counts from its turn's start

    def _changed(self, changed: bool) -> bool:
        if changed:
            self.version += 1
        return changed


def crowd_keys(owner: Optional[tuple[str, ...]], players: list[tuple[str, ...]]) -> tuple[str, ...]:
    """The crowd's keys for a chunk (module doc): majority per key among the voters (`owner`
    None: the owner did not vote); a tie goes by the owner's vote, else not pressed."""
    voters = players + ([owner] if owner is not None else [])
    pressed = []
    for key in KEY_NAMES:
        votes = sum(key in keys for keys in voters)
        if 2 * votes > len(voters) or (2 * votes == len(voters) and votes and owner is not None and key in owner):
            pressed.append(key)
    return tuple(pressed)


def crowd_voters(inputs: PlayerInputs, pressed: tuple[str, ...]) -> tuple[str, ...]:
    """The players whose votes made a `crowd` chunk that pressed `pressed` (a frame's `voters`):
    those that voted and held a key the chunk pressed, or held none when it pressed none."""
    if inputs.controls != "crowd":
        return ()
    return tuple(v for v, (keys, _) in inputs.states.items()
                 if set(keys) & set(pressed) or (not keys and not pressed))


def chunk_keys(inputs: PlayerInputs, owner_keys: Optional[tuple[str, ...]],
               owner_event: Optional[int]) -> tuple[tuple[str, ...], Optional[int], str]:
    """(keys, event_id, player) of the world's next chunk: `owner_keys` None when the owner sent
    no `control` for the session. `player`: `owner`, the holder's viewer id, or `crowd`."""
    if inputs.controls == "turns" and inputs.holder is not None:
        keys, event_id = inputs.states.get(inputs.holder, ((), None))
        return keys, event_id, inputs.holder
    if inputs.controls == "crowd" and inputs.states:
        return crowd_keys(owner_keys, [keys for keys, _ in inputs.states.values()]), None, CROWD
    return owner_keys or (), owner_event, OWNER
