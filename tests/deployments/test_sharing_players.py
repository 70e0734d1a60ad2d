"""Players of a shared world through the real app (/resume: two ingress replicas, the WorldHub):
a player in `turns` drives and the owner's and viewers' frames say whose input made them;
`crowd` merges two players' keys (and the owner's vote); grant / revoke / kick; a viewer's
infer, control, prompt and rewind refused with nothing changed; a player's keys wake a paused
driven world; the director's prompt steers; the owner told its world's viewers and players as
they change (`notify_players`); a crowd chunk's voters (issue 56). The policy itself
without Ray: tests/deployments/test_control_policy.py."""
from __future__ import annotations

import asyncio

import numpy as np
import websockets

from camera.keys import KeySteps, key_chunk_poses
from protocol.codec import encode
from protocol.errors import ErrorCode
from protocol.messages import (AckRequest, AskControlsRequest, ControlRequest, ErrorReply, FrameReply, GrantRequest,
                               KickRequest, PassControlsRequest, Paused, PromptRequest, ResetRequest, RevokeRequest,
                               RewindRequest)
from protocol.requests import SessionStart, drive_request, infer_request
from protocol.sharing import Players, Watching
from world_viewers import Viewer, share

STEPS = KeySteps()  # the app runs the default `controls`
TRIES = 20  # key-driven chunks at most until a player's input reached the owner's side
DELIVERY_S = 3.0  # a director's prompt reaches the owner's side well within it (two Ray calls)
NEW_PROMPT = "a snowy mountain village at night, lanterns glowing"


async def start(owner, sid: str, example) -> FrameReply:
    await owner.send(encode(infer_request(sid, start=SessionStart(example.image, example.prompt), from_keys=True)))
    reply = await owner.recv()
    assert isinstance(reply, FrameReply), reply
    return reply


async def keyed(owner, sid: str) -> FrameReply:
    await owner.send(encode(infer_request(sid, from_keys=True)))
    reply = await owner.recv()
    assert isinstance(reply, FrameReply), reply
    return reply


async def until(owner, sid: str, done) -> tuple[list[FrameReply], FrameReply]:
    """Key-driven chunks until `done(reply, previous)`: (every reply, the last)."""
    replies = []
    for _ in range(TRIES):
        replies.append(await keyed(owner, sid))
        if done(replies[-1], replies[-2] if len(replies) > 1 else None):
            return replies, replies[-1]
        await asyncio.sleep(0.2)
    raise AssertionError(f"no chunk matched in {TRIES}: {[(r.chunk_id, r.player, r.event_id) for r in replies]}")


async def frame_of(viewer: Viewer, chunk_id: int) -> FrameReply:
    while (reply := await viewer.frame()).chunk_id != chunk_id:
        pass
    return reply


async def owner_says(owner, request) -> object:
    await owner.send(encode(request))
    return await owner.recv()


async def told(owner, done) -> Players:
    """The owner's next unasked `players` that `done` accepts (earlier ones skipped)."""
    while True:
        reply = await asyncio.wait_for(owner.recv(), 30)
        assert isinstance(reply, Players) and reply.notice, reply
        if done(reply):
            return reply


async def answered(owner, request) -> object:
    """The answer to the owner's `request` (the unasked `players` read meanwhile skipped)."""
    await owner.send(encode(request))
    while isinstance(reply := await owner.recv(), Players) and reply.notice:
        pass
    return reply


def test_the_owner_is_told_its_worlds_viewers_and_players_as_they_change(resume_server, resume_connect, example):
    """A share with `notify_players`: the owner's socket gets `players` unasked (`notice`) at
    once (nobody watches), when a viewer joins (its viewer_id listed), when it asks for the
    controls (a player), when the owner passes them to it, and when it leaves; the answer to
    the owner's `pass_controls` is no notice and lists the viewers too."""
    async def go():
        async with resume_connect() as owner:
            await start(owner, "n1", example)
            shared = await share(owner, "n1", controls="turns", notify_players=True)
            at_share = await told(owner, lambda p: True)
            viewer, watching = await Viewer.open(resume_server, shared.world_id, shared.watch_token)
            joined = await told(owner, lambda p: p.viewers == 1)
            await viewer.ws.send(encode(AskControlsRequest(session_id=shared.world_id)))
            asked = await told(owner, lambda p: p.players != [])
            passed = await answered(owner, PassControlsRequest(session_id="n1", viewer_id=watching.viewer_id))
            await viewer.ws.close()
            left = await told(owner, lambda p: p.viewers == 0)
            await answered(owner, ResetRequest(session_id="n1"))
        return at_share, shared, watching, joined, asked, passed, left

    at_share, shared, watching, joined, asked, passed, left = asyncio.run(go())
    vid = watching.viewer_id
    assert (at_share.world_id, at_share.viewers, at_share.viewer_ids, at_share.players) == (shared.world_id, 0, [], [])
    assert (at_share.session_id, at_share.controls, at_share.holder) == ("n1", "turns", "owner")
    assert (joined.viewer_ids, joined.players) == ([vid], []) and joined.version > at_share.version
    assert (asked.players, asked.holder) == ([vid], "owner")
    assert isinstance(passed, Players) and not passed.notice
    assert (passed.holder, passed.players, passed.viewer_ids, passed.viewers) == (vid, [vid], [vid], 1)
    assert (left.viewer_ids, left.players, left.holder) == ([], [], "owner")  # its leaving took its turn back


def test_turns_a_player_drives_and_every_frame_says_whose_input_made_it(resume_server, resume_connect, example):
    """`turns`: a viewer asks (a player waiting), the owner passes it the controls, its
    `control` drives the owner's key-driven chunks (the owner's own keys drive nothing now):
    the owner's frame and the viewer's say `player` = its viewer_id with its `event_id`."""
    async def go():
        async with resume_connect() as owner:
            first = await start(owner, "t1", example)
            shared = await share(owner, "t1", controls="turns")
            viewer, watching = await Viewer.open(resume_server, shared.world_id, shared.watch_token)
            vid = watching.viewer_id
            await viewer.ws.send(encode(AskControlsRequest(session_id=shared.world_id)))
            asked = await viewer.event("controls")
            passed = await owner_says(owner, PassControlsRequest(session_id="t1", viewer_id=vid))
            await viewer.ws.send(encode(ControlRequest(session_id=shared.world_id, event_id=41, keys=("w",))))
            await owner.send(encode(ControlRequest(session_id="t1", event_id=1, keys=("s",))))
            replies, mine = await until(owner, "t1", lambda r, _: (r.player, r.event_id) == (vid, 41))
            replies.insert(0, first)
            theirs = await frame_of(viewer, mine.chunk_id)
            back = await owner_says(owner, PassControlsRequest(session_id="t1"))  # the owner takes them back
            _, own = await until(owner, "t1", lambda r, _: r.player == "owner")
            await viewer.ws.close()
            await owner.reset("t1")
        return watching, asked, passed, replies, mine, theirs, back, own

    watching, asked, passed, replies, mine, theirs, back, own = asyncio.run(go())
    assert isinstance(watching, Watching) and watching.controls == "turns" and watching.holder == "owner"
    vid = watching.viewer_id
    assert (asked.holder, asked.players) == ("owner", [vid])
    assert isinstance(passed, Players) and (passed.holder, passed.players) == (vid, [vid])
    # before its key state came: the owner's keys (S), then the holder's none yet
    assert all((r.player, r.event_id) in (("owner", 1), (vid, None)) for r in replies[1:-1]), replies
    assert (mine.player, mine.event_id) == (vid, 41)
    expected = key_chunk_poses(replies[-2].poses[-1].astype(np.float64), {"w"}, STEPS)
    np.testing.assert_allclose(mine.poses, expected, atol=1e-5)  # its W, not the owner's S
    assert mine.poses[-1, 2, 3] > mine.poses[0, 2, 3]  # forward (+z): W
    assert (theirs.player, theirs.event_id, theirs.video) == (vid, 41, mine.video)
    assert isinstance(back, Players) and back.holder == "owner"
    assert (own.player, own.event_id) == ("owner", 1) and own.poses[-1, 2, 3] < own.poses[0, 2, 3]  # S: backward


def test_crowd_merges_two_players_keys_and_the_owners_vote(resume_server, resume_connect, example):
    """`crowd`: two players hold W+A and W+D: W is pressed (2 of 2), A and D are 1-1 ties
    without the owner's vote (not pressed); the owner then votes A: W and A (2 of 3)."""
    async def go():
        async with resume_connect() as owner:
            first = await start(owner, "c1", example)
            shared = await share(owner, "c1", controls="crowd")
            players = [await Viewer.open(resume_server, shared.world_id, shared.watch_token) for _ in range(2)]
            for (viewer, _), keys in zip(players, (("w", "a"), ("w", "d"))):
                await viewer.ws.send(encode(AskControlsRequest(session_id=shared.world_id)))
                await viewer.ws.send(encode(ControlRequest(session_id=shared.world_id, event_id=7, keys=keys)))

            def only_w(reply, previous) -> bool:
                before = (previous or first).poses[-1].astype(np.float64)
                return reply.player == "crowd" and np.allclose(reply.poses, key_chunk_poses(before, {"w"}, STEPS),
                                                               atol=1e-5)

            _, merged = await until(owner, "c1", only_w)
            await owner.send(encode(ControlRequest(session_id="c1", event_id=2, keys=("a",))))
            voted = await keyed(owner, "c1")
            theirs = await frame_of(players[0][0], voted.chunk_id)
            vids = {watching.viewer_id for _, watching in players}
            for viewer, _ in players:
                await viewer.ws.close()
            await owner.reset("c1")
        return merged, voted, theirs, vids

    merged, voted, theirs, vids = asyncio.run(go())
    assert set(merged.voters) == vids and theirs.voters == voted.voters  # both held W: both votes made them
    assert (merged.player, merged.event_id) == ("crowd", None)
    expected = key_chunk_poses(merged.poses[-1].astype(np.float64), {"w", "a"}, STEPS)
    np.testing.assert_allclose(voted.poses, expected, atol=1e-5)  # the owner's A breaks the tie
    assert voted.player == "crowd" and (theirs.player, theirs.video) == ("crowd", voted.video)


def test_grant_revoke_and_kick(resume_server, resume_connect, example):
    """The owner grants a viewer (its control drives), revokes it (its control is refused and
    the owner's keys drive again), kicks another (`kicked`, the socket closed with 1008; that
    address cannot watch the world again); a viewer id that does not watch is `bad_message`."""
    async def go():
        async with resume_connect() as owner:
            await start(owner, "g1", example)
            shared = await share(owner, "g1", controls="crowd")
            player, watching = await Viewer.open(resume_server, shared.world_id, shared.watch_token)
            other, other_watching = await Viewer.open(resume_server, shared.world_id, shared.watch_token)
            vid = watching.viewer_id
            granted = await owner_says(owner, GrantRequest(session_id="g1", viewer_id=vid))
            await player.ws.send(encode(ControlRequest(session_id=shared.world_id, event_id=3, keys=("w",))))
            _, driven = await until(owner, "g1", lambda r, _: r.player == "crowd")
            revoked = await owner_says(owner, RevokeRequest(session_id="g1", viewer_id=vid))
            await player.ws.send(encode(ControlRequest(session_id=shared.world_id, event_id=4, keys=("d",))))
            refused = await player.error()
            _, own = await until(owner, "g1", lambda r, _: r.player == "owner")
            unknown = await owner_says(owner, GrantRequest(session_id="g1", viewer_id="f" * 16))
            kicked = await owner_says(owner, KickRequest(session_id="g1", viewer_id=other_watching.viewer_id))
            notice = await other.event("kicked")
            try:
                await asyncio.wait_for(other.ws.recv(), 10)
                closed = None
            except websockets.ConnectionClosed as e:
                closed = e.rcvd.code if e.rcvd else None
            _, again = await Viewer.open(resume_server, shared.world_id, shared.watch_token)
            still = await keyed(owner, "g1")
            theirs = await frame_of(player, still.chunk_id)  # the revoked player still watches
            await player.ws.close()
            await owner.reset("g1")
        return granted, driven, revoked, refused, own, unknown, kicked, notice, closed, again, still, theirs

    granted, driven, revoked, refused, own, unknown, kicked, notice, closed, again, still, theirs = asyncio.run(go())
    assert isinstance(granted, Players) and len(granted.players) == 1 and granted.holder is None  # crowd: no holder
    assert driven.player == "crowd" and driven.poses[-1, 2, 3] > driven.poses[0, 2, 3]
    assert isinstance(revoked, Players) and revoked.players == []
    assert isinstance(refused, ErrorReply) and refused.code is ErrorCode.FORBIDDEN
    assert own.player == "owner" and np.allclose(own.poses[0], own.poses[-1], atol=1e-6)  # no key held: D drove nothing
    assert isinstance(unknown, ErrorReply) and unknown.code is ErrorCode.BAD_MESSAGE
    assert isinstance(kicked, Players) and notice.event == "kicked" and closed == 1008
    assert isinstance(again, ErrorReply) and again.code is ErrorCode.FORBIDDEN  # the kicked address comes back
    assert theirs.video == still.video


def test_a_viewer_without_a_role_changes_nothing(resume_server, resume_connect, example):
    """A viewer of an `owner` world: infer, control, the director's `prompt`, rewind and
    ask_controls are each `forbidden`; the owner's next chunk is its own (chunk 1, `owner`,
    the prompt unchanged) and the viewer gets it."""
    async def go():
        async with resume_connect() as owner:
            await start(owner, "o1", example)
            shared = await share(owner, "o1")
            viewer, _ = await Viewer.open(resume_server, shared.world_id, shared.watch_token)
            await viewer.frame()
            wid = shared.world_id
            for request in (AskControlsRequest(session_id=wid), ControlRequest(session_id=wid, event_id=9, keys=("w",)),
                            PromptRequest(session_id=wid, prompt="a storm"), RewindRequest(session_id=wid, to_chunk=0)):
                await viewer.ws.send(encode(request))
            await viewer.ws.send(encode(infer_request(wid, from_keys=True)))
            errors = [await viewer.error() for _ in range(5)]
            mine = await keyed(owner, "o1")
            theirs = await frame_of(viewer, mine.chunk_id)
            await viewer.ws.close()
            await owner.reset("o1")
        return errors, mine, theirs

    errors, mine, theirs = asyncio.run(go())
    assert sorted(e.code.value for e in errors) == ["forbidden"] * 5, errors
    assert (mine.chunk_id, mine.player, mine.event_id) == (1, "owner", None)
    assert np.allclose(mine.poses[0], mine.poses[-1], atol=1e-6) and theirs.video == mine.video


def test_a_players_keys_wake_a_paused_driven_world_and_its_release_pauses_it(resume_server, resume_connect, example):
    """A `drive`n session paused (no key held), shared with `turns`: the player holding the
    controls presses W and the driver wakes (the owner's side's inbox), its chunks say the
    player's viewer_id and event_id; the player releases every key and the world pauses again."""
    async def go():
        async with resume_connect() as owner:
            await owner.send(encode(drive_request("d1", SessionStart(example.image, example.prompt))))
            while not isinstance(paused := await owner.recv(), Paused):
                await owner.send(encode(AckRequest(session_id="d1", chunk_id=paused.chunk_id)))
            shared = await share(owner, "d1", controls="turns")
            viewer, watching = await Viewer.open(resume_server, shared.world_id, shared.watch_token)
            await viewer.ws.send(encode(AskControlsRequest(session_id=shared.world_id)))
            await viewer.event("controls")
            await owner_says(owner, PassControlsRequest(session_id="d1", viewer_id=watching.viewer_id))
            await viewer.ws.send(encode(ControlRequest(session_id=shared.world_id, event_id=5, keys=("w",))))
            woken = await owner.recv()
            await owner.send(encode(AckRequest(session_id="d1", chunk_id=woken.chunk_id)))
            await viewer.ws.send(encode(ControlRequest(session_id=shared.world_id, event_id=6, keys=())))
            driven = [woken]
            while not isinstance(again := await owner.recv(), Paused):
                driven.append(again)
                await owner.send(encode(AckRequest(session_id="d1", chunk_id=again.chunk_id)))
            await viewer.ws.close()
            await owner.reset("d1")
        return paused, watching, driven, again

    paused, watching, driven, again = asyncio.run(go())
    assert isinstance(paused, Paused) and paused.next_chunk_id == 1
    assert isinstance(driven[0], FrameReply) and driven[0].chunk_id == 1
    assert all(r.player == watching.viewer_id and r.event_id in (5, 6) for r in driven)  # each the player's
    assert (driven[0].player, driven[0].event_id) == (watching.viewer_id, 5)
    assert isinstance(again, Paused) and again.next_chunk_id == driven[-1].chunk_id + 1


def test_the_directors_prompt_steers_the_worlds_next_chunk(resume_server, resume_connect, example):
    """The owner names a viewer director; its `prompt` (on the watch route) steers the world's
    next chunk exactly as the owner's own `prompt_update` would: the same bytes as a session
    steered by its owner (same seed, same cameras). A player that is not the director is
    `forbidden`."""
    async def go():
        async with resume_connect() as owner:
            await owner.infer("ref", example, 0, first=True, seed=5)
            await owner.infer("ref", example, 1, first=False, prompt_update=NEW_PROMPT)
            reference = [await owner.recv(), await owner.recv()]
            await owner.reset("ref")
            await owner.infer("dir", example, 0, first=True, seed=5)
            mine = [await owner.recv()]
            shared = await share(owner, "dir")
            viewer, watching = await Viewer.open(resume_server, shared.world_id, shared.watch_token)
            await owner_says(owner, GrantRequest(session_id="dir", viewer_id=watching.viewer_id))
            await viewer.ws.send(encode(PromptRequest(session_id=shared.world_id, prompt=NEW_PROMPT)))
            refused = await viewer.error()  # a player, not yet the director
            named = await owner_says(owner, GrantRequest(session_id="dir", viewer_id=watching.viewer_id, director=True))
            await viewer.ws.send(encode(PromptRequest(session_id=shared.world_id, prompt=NEW_PROMPT)))
            await asyncio.sleep(DELIVERY_S)  # viewer -> hub -> the owner's inbox (no reply to wait for)
            await owner.infer("dir", example, 1, first=False)
            mine.append(await owner.recv())
            await viewer.ws.close()
            await owner.reset("dir")
        return reference, mine, refused, named

    reference, mine, refused, named = asyncio.run(go())
    assert isinstance(refused, ErrorReply) and refused.code is ErrorCode.FORBIDDEN
    assert isinstance(named, Players) and named.director is not None
    assert [r.video for r in mine] == [r.video for r in reference]  # steered by the director as by its owner
