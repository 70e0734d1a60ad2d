"""ForkAsks: the WorldHub as the meeting point of a fork of a shared world (fork.py).

A viewer's ingress replica asks the hub for the world's head (`ask`: the token and the
audience checked by book.py `may_fork`); the world's owner side, wherever its ingress replica
is, long-polls the asks of its stream (`wanted`) and answers each one (`answer`) with a
reference to its session's snapshot in Ray's object store (or a typed error). The ask waits
for that answer at most `timeout_s`. No Ray here: the hub serialises every call on its event
loop.
"""
from __future__ import annotations

import asyncio
import secrets
from collections import deque
from typing import Any, Optional

from deployments.errors import Busy

MAX_WAITING_ASKS = 64  # per stream: more asks at once are `busy`


class ForkAsks:
    """The asks of every shared stream, and their answers."""

    def __init__(self) -> None:
        self._asks: dict[str, deque[str]] = {}  # stream key -> ask ids not yet taken by its owner side
        self._answers: dict[str, asyncio.Future] = {}  # ask id -> its answer
        self._wake: dict[str, asyncio.Event] = {}  # stream key -> set when an ask comes

    async def ask(self, stream_key: str, timeout_s: float) -> Any:
        """The owner side's answer to a new ask of `stream_key`; Busy when none comes in time."""
        asks = self._asks.setdefault(stream_key, deque())
        if len(asks) >= MAX_WAITING_ASKS:
            raise Busy("this world's owner has many forks to answer; try again", retry_after_s=2.0)
        ask_id = secrets.token_hex(8)
        answer = self._answers[ask_id] = asyncio.get_running_loop().create_future()
        asks.append(ask_id)
        self._wake.setdefault(stream_key, asyncio.Event()).set()
        try:
            return await asyncio.wait_for(answer, timeout_s)
        except TimeoutError:
            raise Busy("the world's owner did not answer the fork in time (its server is busy or gone); "
                       "try again", retry_after_s=5.0) from None
        finally:
            self._answers.pop(ask_id, None)
            if ask_id in asks:
                asks.remove(ask_id)
            if not asks:
                self._asks.pop(stream_key, None)

    async def wanted(self, stream_key: str, timeout_s: float) -> list[str]:
        """The asks of `stream_key` waiting for its owner side (waits up to `timeout_s` for one)."""
        if not self._asks.get(stream_key):
            wake = self._wake.setdefault(stream_key, asyncio.Event())
            wake.clear()
            try:
                await asyncio.wait_for(wake.wait(), timeout_s)
            except TimeoutError:
                pass
        asks = self._asks.get(stream_key)
        taken = list(asks) if asks else []
        if asks:
            asks.clear()
        return taken

    def answer(self, ask_id: str, answer: Any) -> bool:
        """The owner side's answer (False: the ask is gone, e.g. timed out)."""
        future: Optional[asyncio.Future] = self._answers.get(ask_id)
        if future is None or future.done():
            return False
        future.set_result(answer)
        return True

    def forget(self, stream_key: str) -> None:
        """The stream's world ended: its owner side's long poll stops waiting."""
        wake = self._wake.pop(stream_key, None)
        if wake is not None:
            wake.set()
