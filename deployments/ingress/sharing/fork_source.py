"""ForkSources: the owner's side of forks of its shared worlds ("take it from here").

The session's journal lives beside the owner's connection, on whichever ingress replica it
is. For each shared session the owner side long-polls the hub for fork asks (hub.py
`fork_wanted`, fork_asks.py); for each batch it takes the session's head (`WorldHead`: its
options, the journal of the chunks its viewers were sent, its image), puts it once in Ray's
object store and answers every ask with the reference (or a typed error when the session
cannot be forked: no chunk sent yet, its journal over `sessions.journal_max_mib`). The
viewer's ingress replica rebuilds a session of its own from it (fork.py). The poll ends with
the world (the hub answers None) or when the connection stops publishing the session.
"""
from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import ray
from ray.serve.handle import DeploymentHandle

from deployments.errors import ReplicaError, SessionLost, TooLarge
from deployments.ingress.detached import detach, retrieved, settle
from deployments.ingress.journal import SessionJournal
from deployments.ingress.stream import Stream, StreamState
from deployments.log import KeyValueLog
from deployments.wire import SessionOptions

POLL_S = 10.0  # one long poll of the hub's asks
HUB_TIMEOUT_S = POLL_S + 10.0


@dataclass(frozen=True, slots=True)
class WorldHead:
    """A shared session as its viewers saw it last: `chunks` chunks, their journal, its image."""

    spec: SessionOptions
    journal: SessionJournal
    image: np.ndarray
    chunks: int


def world_head(stream: Stream, chunks: int) -> WorldHead | ReplicaError:
    """The head of `stream` after `chunks` chunks (those its viewers were sent), or why not."""
    j = stream.journal
    if stream.state is not StreamState.OPEN:
        return SessionLost("this world's session just ended; it cannot be forked")
    if not j.recoverable or len(j.chunks) < chunks:
        return TooLarge("this world's session is larger than the server rebuilds (sessions.journal_max_mib) "
                        "or not rebuildable (sessions.recovery off): it cannot be forked")
    if chunks < 1 or j.context is None:
        return SessionLost("this world has no chunk to fork yet; try again after its first chunk")
    journal = j.prefix(chunks)
    journal.snapshots = {}  # the owner's replicas' snapshots stay the owner's: the fork replays
    return WorldHead(spec=stream.spec, journal=journal, image=stream.image, chunks=chunks)


class ForkSources:
    """One connection's answers to the forks of the sessions it shares (module doc)."""

    def __init__(self, hub: DeploymentHandle, log: KeyValueLog) -> None:
        self._hub = hub
        self._log = log
        self._tasks: dict[str, asyncio.Task] = {}

    def start(self, key: str, head: Callable[[], WorldHead | ReplicaError]) -> None:
        """Answer the forks of stream `key` (its world) with `head()` until `stop`."""
        task = self._tasks.get(key)
        if task is None or task.done():
            task = self._tasks[key] = asyncio.get_running_loop().create_task(self._run(key, head),
                                                                             name=f"fork-source-{key}")
            task.add_done_callback(retrieved)

    def stop(self, key: str) -> None:
        task = self._tasks.pop(key, None)
        if task is not None:
            task.cancel()

    async def _run(self, key: str, head: Callable[[], WorldHead | ReplicaError]) -> None:
        while True:
            ended, asks = await settle(self._hub.fork_wanted.remote(key, POLL_S), HUB_TIMEOUT_S)
            if ended and asks is None:
                return  # the world ended
            if not ended or isinstance(asks, BaseException):
                self._log.warning("the world hub did not answer a fork poll", fields={"error": repr(asks)})
                await asyncio.sleep(1.0)
                continue
            if not asks:
                continue
            answer = head()
            if isinstance(answer, WorldHead):
                answer = [ray.put(answer)]  # in a list: the reference travels, the viewer's replica reads it
            self._log.info("a world's head forked", fields={"session": key, "asks": len(asks)})
            for ask_id in asks:
                detach(settle(self._hub.fork_answer.remote(ask_id, answer), HUB_TIMEOUT_S), name=f"fork-{ask_id}")
