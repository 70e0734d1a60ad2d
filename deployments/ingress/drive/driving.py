"""Driving: a connection's driven session (`drive`, PROTOCOL.md) while it is the current one.

The connection opens a driven session as a first infer and hands it here (`start`); from then
on the session's `Driver` (driver.py) starts its chunks through the connection's `start`
callback, as an infer would queue them, and this part answers what only a driven session
takes: `ack`, and a `control` that wakes the driver (and may preempt its running chunk,
binding.py). Whether a session is driven is whether it has the driver here: a session that
stops being the current one (replaced, reset, switched for a forked one, parked) loses it and
is driven by infers from then on, or is resumed paused and driven again (resume.py).
"""
from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Optional

from deployments.config import AppArgs
from deployments.ingress.controls import ControlBook
from deployments.ingress.drive.binding import Binding, preempt_running
from deployments.ingress.drive.driver import Driver
from deployments.ingress.lanes import Backends
from deployments.ingress.stream import Stream, StreamState
from deployments.log import KeyValueLog
from protocol.errors import ErrorCode, ProtocolError
from protocol.messages import AckRequest, ControlRequest, Paused

# start(stream, dit_started, binding): queue the driven stream's next chunk (quota taken: Busy)
StartDriven = Callable[[Stream, Callable[[], None], Binding], asyncio.Task]


class Driving:
    """The driver of one connection's current driven session, if it has one."""

    def __init__(self, args: AppArgs, backends: Backends, controls: ControlBook, log: KeyValueLog, *,
                 start: StartDriven, put_paused: Callable[[Paused], None],
                 sent_chunks: Callable[[Stream], int]) -> None:
        """`start`: queue a driven chunk (connection.py); `put_paused`: queue a `paused` reply;
        `sent_chunks(stream)`: the chunk replies its client was sent (resume.py)."""
        self._args = args
        self._b = backends
        self._controls = controls
        self._log = log
        self._start = start
        self._put_paused = put_paused
        self._sent_chunks = sent_chunks
        self.driver: Optional[Driver] = None  # the driven session's, while it is current

    def drives(self, stream: Optional[Stream]) -> bool:
        """`stream` is the driven session (it has the driver)."""
        return stream is not None and self.driver is not None and self.driver.stream is stream

    def driven(self, current: Optional[Stream], session_id: str) -> bool:
        """`session_id` names the connection's open driven session (`current`)."""
        return (self.drives(current) and current.state is StreamState.OPEN
                and current.spec.session_id == session_id)

    def start(self, stream: Stream) -> None:
        """Start the driver of `stream` (new, or resumed on this socket: paused until keys come)."""
        sid = stream.spec.session_id
        self.driver = Driver(stream, keys_held=lambda: self._controls.holds_keys(sid), start=self._start,
                             put_paused=self._put_paused, sent_chunks=lambda: self._sent_chunks(stream),
                             max_unacked=self._args.controls.max_unacked_chunks,
                             max_chunks=self._args.sessions.max_chunks, log=self._log, opened=stream.dit_open)

    def stop(self) -> None:
        """No more chunks start (reset, a new or resumed session, the socket's end)."""
        if self.driver is not None:
            self.driver.stop()
            self.driver = None

    def keep_only(self, current: Optional[Stream]) -> None:
        """The connection's current stream is now `current`: a driven session that is not it
        is driven by infers from now on."""
        if self.driver is not None and self.driver.stream is not current:
            self.stop()

    def control(self, req: ControlRequest) -> None:
        """The keys held changed (set in the `ControlBook` already): the driver looks again, and
        its running chunk may be given up for them (`controls.preempt`)."""
        d = self.driver
        if d is not None:
            d.wake()
            if self._args.controls.preempt and d.stream.spec.session_id == req.session_id:
                preempt_running(self._b, d.stream, d.binding, req.keys)

    def wake(self) -> None:
        """Something the driver reads changed besides a control (a shared world's players' keys)."""
        if self.driver is not None:
            self.driver.wake()

    def ack(self, req: AckRequest, current: Optional[Stream]) -> None:
        d = self.driver
        if d is None or d.stream is not current or d.stream.spec.session_id != req.session_id:
            raise ProtocolError(ErrorCode.BAD_MESSAGE, "`ack` is for the connection's driven session (`drive`); "
                                                       "this connection drives no session of that id")
        d.ack(req)
