"""ControlPolicy (deployments/ingress/sharing/policy.py) and the WorldBook's players without Ray:
turns (ask, pass, the owner passes, an idle holder loses), crowd (majority, tie-break, players
that sent nothing, the voters a crowd chunk names), grant / revoke / kick, the `controls` notices,
the director; what the owner's side reads of its world's viewers and roles; a player's controls
coalesced on their way to the hub (playing.py) (issue 56)."""
from __future__ import annotations

import asyncio

import pytest

from deployments.ingress.sharing.book import NoSuchViewer, WorldBook
from deployments.ingress.sharing.playing import Playing
from deployments.ingress.sharing.policy import ControlPolicy, Forbidden, chunk_keys, crowd_keys, crowd_voters
from deployments.share_args import SharingArgs
from protocol.codec import encode
from protocol.errors import ErrorCode
from protocol.limits import DEFAULT_LIMITS
from protocol.messages import ControlRequest, ResetRequest

IDLE_S = 15.0


def turns() -> ControlPolicy:
    return ControlPolicy("turns", IDLE_S)


def test_turns_askers_wait_and_the_holder_passes_to_a_named_player():
    p = turns()
    assert p.ask("a", now=0.0) and p.ask("b", now=0.0)
    assert p.holder is None and p.waiting == ["a", "b"] and p.players == ["a", "b"]  # the owner holds them
    with pytest.raises(Forbidden):
        p.control("a", ("w",), 1, now=1.0)  # waiting: its control is refused, nothing recorded
    with pytest.raises(Forbidden):
        p.pass_to("a", "b", now=1.0)  # only the holder (or the owner) passes
    assert p.pass_to(None, "a", now=1.0)  # the owner passes to a
    assert p.holder == "a" and p.waiting == ["b"]
    p.control("a", ("w",), 7, now=2.0)
    assert chunk_keys(p.inputs(), ("s",), 3) == (("w",), 7, "a")  # the holder's keys, not the owner's
    with pytest.raises(Forbidden):
        p.control("b", ("s",), 1, now=2.0)
    assert p.pass_to("a", "b", now=3.0)  # the holder passes on
    assert p.holder == "b" and chunk_keys(p.inputs(), None, None) == ((), None, "b")  # a's keys stopped with its turn
    assert p.pass_to(None, None, now=4.0) and p.holder is None  # the owner takes them back
    assert chunk_keys(p.inputs(), ("s",), 3) == (("s",), 3, "owner")
    with pytest.raises(Forbidden):
        p.pass_to(None, "stranger", now=5.0)  # not a player


def test_turns_an_idle_holder_loses_the_controls_to_the_next_asker_then_to_the_owner():
    p = turns()
    for viewer in ("a", "b"):
        p.ask(viewer, now=0.0)
    p.pass_to(None, "a", now=0.0)
    p.control("a", ("w",), 1, now=10.0)
    assert not p.tick(now=10.0 + IDLE_S)  # exactly idle_s since its last control: it keeps them
    assert p.tick(now=10.0 + IDLE_S + 0.1) and p.holder == "b" and p.waiting == []
    assert not p.tick(now=10.0 + 2 * IDLE_S)  # b's idle time counts from its turn's start
    assert p.tick(now=10.0 + 2 * IDLE_S + 0.2) and p.holder is None  # nobody waits: back to the owner
    assert not p.tick(now=1000.0)  # the owner holding them never loses them by idleness


def test_crowd_majority_per_key_tie_goes_by_the_owner_and_silent_players_do_not_vote():
    assert crowd_keys(("w",), [("w", "a"), ("a",)]) == ("w", "a")  # w 2 of 3, a 2 of 3
    assert crowd_keys(("w",), [("s",)]) == ("w",)  # 1 to 1: the owner's vote decides
    assert crowd_keys(None, [("w",), ()]) == ()  # 1 to 1 without the owner voting: not pressed
    assert crowd_keys(None, [("w", "d"), ("w",), ("d",)]) == ("w", "d")
    p = ControlPolicy("crowd", IDLE_S)
    for viewer in ("a", "b", "c"):
        p.ask(viewer, now=0.0)
    p.control("a", ("w",), 1, now=1.0)
    p.control("b", ("s",), 2, now=1.0)  # c sent nothing: it does not vote (not a `()` vote)
    assert chunk_keys(p.inputs(), ("w",), 9) == (("w",), None, "crowd")  # w 2 of 3 voters
    assert chunk_keys(p.inputs(), None, None) == ((), None, "crowd")  # a 1-1 tie without the owner
    p.control("a", ("w",), 3, now=1.0 + IDLE_S)
    assert p.tick(now=1.0 + IDLE_S + 0.1)  # b went silent: it stops voting
    assert chunk_keys(p.inputs(), None, None) == (("w",), None, "crowd")
    assert p.revoke("a", now=20.0) and chunk_keys(p.inputs(), ("d",), 4) == (("d",), 4, "owner")


def test_a_crowd_chunk_names_the_voters_whose_keys_it_pressed():
    p = ControlPolicy("crowd", IDLE_S)
    for viewer in ("a", "b", "c", "d"):
        p.ask(viewer, now=0.0)
    p.control("a", ("w",), 1, now=1.0)
    p.control("b", ("w", "a"), 2, now=1.0)
    p.control("c", ("s",), 3, now=1.0)  # outvoted: its key is not pressed; d sent nothing: no vote
    keys, _, player = chunk_keys(p.inputs(), None, None)
    assert (keys, player) == (("w",), "crowd")
    assert crowd_voters(p.inputs(), keys) == ("a", "b")  # b's `a` lost, its `w` made the chunk
    p.control("a", (), 4, now=2.0)
    p.control("b", (), 5, now=2.0)  # two of three hold nothing: nothing pressed, and that is their vote
    keys, _, _ = chunk_keys(p.inputs(), None, None)
    assert keys == () and crowd_voters(p.inputs(), keys) == ("a", "b")
    assert crowd_voters(turns().inputs(), ("w",)) == ()  # only a crowd chunk has voters


def test_the_owners_side_reads_the_viewers_and_a_new_version_when_one_joins_or_leaves():
    book = WorldBook(SharingArgs(turn_idle_s=IDLE_S))
    world = book.share("key:o", "s-1", "link", "turns", now=0.0)
    before = book.inputs("s-1")
    assert (before.world_id, before.viewers, before.players) == (world.world_id, (), ())
    a = book.join(world.world_id, world.token, "key:a", "1.1.1.1", now=0.0)
    b = book.join(world.world_id, world.token, "key:b", "1.1.1.2", now=0.0)
    joined = book.inputs("s-1")
    assert joined.viewers == (a.viewer_id, b.viewer_id) and joined.version > before.version
    assert joined.roles() != before.roles()
    book.ask(world.world_id, b.viewer_id, now=1.0)
    asked = book.inputs("s-1")
    assert asked.players == (b.viewer_id,) and asked.version > joined.version
    book.leave(world.world_id, a.viewer_id, now=2.0)  # no player: only the viewers change
    left = book.inputs("s-1")
    assert left.viewers == (b.viewer_id,) and left.players == (b.viewer_id,) and left.version > asked.version


def test_owner_controls_refuse_askers_and_players_controls_but_take_a_director():
    p = ControlPolicy("owner", IDLE_S)
    with pytest.raises(Forbidden):
        p.ask("a", now=0.0)
    assert p.grant("a", director=True) and p.director == "a"
    with pytest.raises(Forbidden):
        p.control("a", ("w",), 1, now=0.0)
    with pytest.raises(Forbidden):
        p.pass_to(None, "a", now=0.0)
    assert p.revoke("a", now=1.0) and p.director is None and p.players == []


def test_the_book_grants_revokes_kicks_and_tells_the_viewers():
    book = WorldBook(SharingArgs(turn_idle_s=IDLE_S))
    world = book.share("key:o", "s-1", "link", "turns", now=0.0)
    a = book.join(world.world_id, world.token, "key:a", "1.1.1.1", now=0.0)
    b = book.join(world.world_id, world.token, "key:b", "1.1.1.2", now=0.0)
    assert a.holder == "owner" and a.players == ()
    with pytest.raises(Forbidden):
        book.control(world.world_id, a.viewer_id, ("w",), 1, now=0.0)  # not a player
    book.owners("s-1", "key:o", "grant", a.viewer_id, now=1.0)
    book.owners("s-1", "key:o", "pass", a.viewer_id, now=1.0)
    assert book.control(world.world_id, a.viewer_id, ("w",), 1, now=2.0)
    assert book.inputs("s-1").states == {a.viewer_id: (("w",), 1)}
    notices = [i for i in world.items if i.event == "controls"]
    assert (notices[-1].holder, notices[-1].players) == (a.viewer_id, (a.viewer_id,))
    with pytest.raises(NoSuchViewer):
        book.owners("s-1", "key:o", "grant", "nobody", now=2.0)
    with pytest.raises(Exception):
        book.owners("s-1", "key:intruder", "grant", b.viewer_id, now=2.0)  # another principal's stream: not shared
    book.owners("s-1", "key:o", "revoke", a.viewer_id, now=3.0)
    assert book.inputs("s-1").holder is None and world.items[-1].players == ()  # back to the owner
    with pytest.raises(Forbidden):
        book.control(world.world_id, a.viewer_id, ("w",), 2, now=3.0)  # revoked: refused, nothing changed
    book.ask(world.world_id, b.viewer_id, now=4.0)
    book.owners("s-1", "key:o", "kick", b.viewer_id, now=5.0)
    kicked = [i for i in world.items if i.event == "kicked"]
    assert kicked[-1].target == b.viewer_id and b.viewer_id not in world.viewers and world.policy.players == []
    with pytest.raises(Forbidden):
        book.join(world.world_id, world.token, "key:b", "1.1.1.2", now=6.0)  # the kicked key comes back: refused


def test_the_director_alone_steers_the_prompt():
    p = ControlPolicy("turns", IDLE_S)
    p.grant("a")
    with pytest.raises(Forbidden):
        p.steer("a", "a storm")  # a player, not the director
    p.grant("a", director=True)
    p.steer("a", "a storm")
    assert (p.inputs().prompt_seq, p.inputs().prompt) == (1, "a storm")
    p.revoke("a", now=1.0)
    with pytest.raises(Forbidden):
        p.steer("a", "calm")


class _SlowHub:
    """A hub whose `control` answers when the test lets it (`gate`), recording each call."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []
        self.gate = asyncio.Event()
        self.control = self

    def remote(self, *args):
        self.calls.append(args)

        async def answer() -> None:
            await self.gate.wait()

        return answer()


def test_a_player_flooding_controls_costs_the_hub_one_call_at_a_time():
    """Playing (playing.py): 50 controls while the hub answers the first: the hub gets that one
    and then only the latest (a key state is the whole state), no error; a request a viewer may
    not send is refused at once, without a hub call."""
    async def go():
        hub, errors = _SlowHub(), []
        playing = Playing(hub, "w1", "v1", DEFAULT_LIMITS, errors.append)
        for k in range(50):
            playing.handle(encode(ControlRequest(session_id="w1", event_id=k, keys=("w",) if k % 2 else ("s",))))
            if k == 0:
                await asyncio.sleep(0.01)  # its call is in flight at the hub
        playing.handle(encode(ResetRequest(session_id="w1")))
        playing.handle(encode(ControlRequest(session_id="another", event_id=1, keys=())))
        await asyncio.sleep(0.05)
        assert len(hub.calls) == 1
        hub.gate.set()
        await asyncio.sleep(0.05)
        playing.close()
        return hub.calls, errors, playing.refused

    calls, errors, refused = asyncio.run(go())
    assert [c[3] for c in calls] == [0, 49] and calls[-1][2] == ("w",)
    assert [e.code for e in errors] == [ErrorCode.FORBIDDEN] * 2 and refused == 2
