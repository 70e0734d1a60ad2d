"""Inbox: the players' inputs of one shared session's world, on its owner's ingress replica.

Players' `control`s (and the director's `prompt`) go from their viewer sockets' ingress
replicas to the hub (hub.py, the meeting point); the owner's side long-polls the hub's
`inputs` of the world (one call at a time, answered when their version passes the last one
read) and keeps the latest snapshot (policy.py `PlayerInputs`). The connection's ControlBook
asks it per chunk (`chunk_keys`), when the chunk's camera is worked out, so a chunk reads no
hub on its way: a player's key state reaches the world's next chunk bound after it arrived
(one hub call from the viewer, one back to the owner's side). The director's prompt is read per
chunk too (`steering`), and taken only with a chunk that was accepted: a chunk refused (the
key's quota) leaves it pending for the next. Each new snapshot calls
`on_change` (a driven session's driver looks again: a player's keys may wake it).

The world gone (unshared, ended, the hub restarted with an empty book) stops it: the owner's
own keys drive again.

A snapshot whose roles (policy.py `PlayerInputs.roles`: the holder, the players, the director,
the viewers) differ from the last one's calls `on_roles` too: the owner's socket gets an unasked
`players` (owner.py), so its page lists the viewers and players as they change.
"""
from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Optional

from ray.serve.handle import DeploymentHandle

from deployments.ingress.detached import retrieved, settle
from deployments.ingress.sharing.policy import PlayerInputs, chunk_keys, crowd_voters
from deployments.log import KeyValueLog

POLL_S = 10.0  # one long poll's timeout at the hub
HUB_TIMEOUT_S = POLL_S + 10.0
RETRY_S = 1.0


class Inbox:
    """One shared session's players' inputs (module doc)."""

    def __init__(self, hub: DeploymentHandle, key: str, session_id: str, on_change: Callable[[], None],
                 log: KeyValueLog, on_roles: Callable[[PlayerInputs], None] = lambda inputs: None) -> None:
        self._hub, self._key, self._on_change, self._log = hub, key, on_change, log
        self._on_roles = on_roles
        self.session_id = session_id
        self.inputs: Optional[PlayerInputs] = None
        self._prompt_seq: Optional[int] = None  # the director's prompts taken (or there before this inbox)
        self.task = asyncio.get_running_loop().create_task(self._run(), name=f"inbox-{key}")
        self.task.add_done_callback(retrieved)

    def chunk_keys(self, owner_keys: Optional[tuple[str, ...]],
                   owner_event: Optional[int]) -> tuple[tuple[str, ...], Optional[int], str]:
        """(keys, event_id, player) of the world's next chunk (policy.py `chunk_keys`); the owner's
        own while no snapshot came yet."""
        if self.inputs is None:
            return owner_keys or (), owner_event, "owner"
        return chunk_keys(self.inputs, owner_keys, owner_event)

    def voters(self, pressed: tuple[str, ...]) -> tuple[str, ...]:
        """The players whose votes made a `crowd` chunk that pressed `pressed` (policy.py
        `crowd_voters`; read right after `chunk_keys`, from the same snapshot)."""
        return () if self.inputs is None else crowd_voters(self.inputs, pressed)

    def steering(self, take: bool = True) -> Optional[str]:
        """The director's prompt not taken yet; taken now (the caller's chunk attends to it)
        unless `take` is False: it stays pending until a chunk is accepted with it (a chunk
        refused by the key's quota leaves it for the next)."""
        inputs = self.inputs
        if inputs is None or inputs.prompt is None or self._prompt_seq is None or inputs.prompt_seq <= self._prompt_seq:
            return None
        if take:
            self._prompt_seq = inputs.prompt_seq
        return inputs.prompt

    async def _run(self) -> None:
        version = -1
        while True:
            ended, result = await settle(self._hub.inputs.remote(self._key, version, POLL_S), HUB_TIMEOUT_S)
            if not ended or isinstance(result, BaseException):
                self._log.warning("a poll of the world hub's player inputs failed", fields={"error": repr(result)})
                await asyncio.sleep(RETRY_S)
                continue
            if result is None:  # the world is gone
                self.inputs = None
                self._on_change()
                return
            if self._prompt_seq is None:
                self._prompt_seq = result.prompt_seq
            told = None if self.inputs is None else self.inputs.roles()
            self.inputs, version = result, result.version
            self._on_change()
            if result.roles() != told:
                self._on_roles(result)
