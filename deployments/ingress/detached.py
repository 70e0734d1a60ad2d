"""Detached tasks: work that must finish even when the request that started it ends.

A WebSocket handler that returns or is cancelled by Serve must not take its session releases
down with it. `detach(coro)` runs `coro` in a task of its own, in a fresh `contextvars.Context`
(outside the request's Serve context: its calls get their own request ids and no cancellation
of the parent reaches them), and keeps a strong reference until it ends.
"""
from __future__ import annotations

import asyncio
import contextvars
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")

_RUNNING: set[asyncio.Task] = set()


def detach(coro: Coroutine[Any, Any, T], name: str) -> asyncio.Task[T]:
    """Start `coro` as a detached task (referenced until done)."""
    task = asyncio.get_running_loop().create_task(coro, name=name, context=contextvars.Context())
    _RUNNING.add(task)
    task.add_done_callback(_RUNNING.discard)
    return task


def retrieved(fut: asyncio.Future) -> None:
    """Mark a future's exception as seen (asyncio logs unseen ones when they are collected): a
    done callback of futures whose failure is answered elsewhere."""
    if not fut.cancelled():
        fut.exception()


def running() -> int:
    """Detached tasks not finished yet (e.g. releases of connections that ended)."""
    return len(_RUNNING)


async def settle(aw: Any, timeout_s: float) -> tuple[bool, Any]:
    """Wait up to `timeout_s` for an awaitable (e.g. a Serve call) WITHOUT cancelling it at the
    deadline: (True, result or exception) when it ended, (False, None) when it is still running
    (it then runs to its end in the background)."""
    task = asyncio.ensure_future(aw)
    _RUNNING.add(task)
    task.add_done_callback(_RUNNING.discard)
    done, _ = await asyncio.wait({task}, timeout=timeout_s)
    if not done:
        return False, None
    if task.cancelled():
        return True, asyncio.CancelledError()
    return True, task.exception() if task.exception() is not None else task.result()
