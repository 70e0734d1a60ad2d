"""drive_keys (client/keydrive.py) against a scripted server: the event-id echo and the control
lag, alone and in a shared world where players' input makes some of the owner's frames
(PROTOCOL.md "Players": `player`, that player's `event_id`)."""
from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Optional

import pytest

from client.cli import _print_lags
from client.errors import BadReply
from client.keydrive import drive_keys
from protocol.messages import FrameReply

PLAYER = "3f2a9c0d1b7e4a55"  # a player's viewer_id


def frame(chunk_id: int, event_id: Optional[int], player: Optional[str] = None) -> FrameReply:
    return FrameReply(session_id="s", chunk_id=chunk_id, video=b"\0", num_frames=9 if chunk_id == 0 else 12,
                      resolution=(32, 48), event_id=event_id, player=player)


class Scripted:
    """A WorldClient stand-in: records the controls, answers each `infer_keys` with the next
    scripted reply; each call advances the fake clock by one second."""

    def __init__(self, replies: list[FrameReply]) -> None:
        self.replies = list(replies)
        self.controls: list[tuple[tuple[str, ...], int]] = []
        self.now = 0.0

    def clock(self) -> float:
        return self.now

    async def control(self, session_id: str, keys, event_id: int) -> int:
        self.controls.append((tuple(keys), event_id))
        return event_id

    async def infer_keys(self, session_id: str, **options) -> FrameReply:
        self.now += 1.0
        return self.replies.pop(0)


def drive(client: Scripted, keys: list[tuple[str, ...]]):
    into = SimpleNamespace(video=[], stats=[])
    return asyncio.run(drive_keys(client, "s", keys, into=into, clock=client.clock)), into


def test_alone_every_frame_echoes_the_last_control_and_each_key_state_has_its_lag():
    client = Scripted([frame(0, 1), frame(1, 1), frame(2, 2)])
    log, into = drive(client, [("w",), ("w",), ("a",)])
    assert client.controls == [(("w",), 1), (("a",), 2)]
    assert log.event_ids == [1, 1, 2] and log.players == ["owner"] * 3 and log.others_chunks == 0
    assert log.control_lags_s == [1.0, 1.0] and len(into.stats) == 3


def test_frames_made_by_a_player_are_theirs_not_the_owners_lag_and_do_not_raise(capsys):
    """`turns`: a player holds the controls for chunks 1-2 (its event ids 41, 42: above the
    owner's), `crowd` makes chunk 3 (no event_id); the owner's key state 2 (sent before chunk 1)
    is first echoed by its own chunk 4: its lag runs to then, not to the player's frame."""
    client = Scripted([frame(0, 1, "owner"), frame(1, 41, PLAYER), frame(2, 42, PLAYER), frame(3, None, "crowd"),
                       frame(4, 2, "owner")])
    log, into = drive(client, [("w",), ("a",), ("a",), ("a",), ("a",)])
    assert log.event_ids == [1, 41, 42, None, 2]
    assert log.players == ["owner", PLAYER, PLAYER, "crowd", "owner"] and log.others_chunks == 3
    assert log.control_lags_s == [1.0, 4.0]  # state 1 on chunk 0; state 2 sent at t=1, echoed at t=5
    assert len(into.video) == 5  # every chunk is the world's video, whoever drove it
    _print_lags(log)  # what `lwf-client drive` prints
    assert "3 of 5 chunks were made from other players' input" in capsys.readouterr().out


def test_a_wrong_echo_on_the_owners_own_frame_still_raises():
    client = Scripted([frame(0, 1), frame(1, 7, "owner")])
    with pytest.raises(BadReply, match="expected chunk 1 made with event 1, got chunk 1 with event 7"):
        drive(client, [("w",), ("w",)])
    client = Scripted([frame(0, 1), frame(2, 41, PLAYER)])  # a player's frame must still be the next chunk
    with pytest.raises(BadReply, match="expected chunk 1"):
        drive(client, [("w",), ("w",)])
