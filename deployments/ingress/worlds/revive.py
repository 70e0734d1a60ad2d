"""Revive: a session the parking does not know, found by its resume token in the world store.

After `serve shutdown` + `serve run`, a `serve deploy` with changed args or a killed ingress
replica, the new parking knows no session; a claim of a token it does not know comes here
(resume.py) before it is refused. The token's digest names the session's world under the
claimant's principal (keeping.py `world_of_token`): the world is loaded (every part checked),
its model compared with the one served (a change: `world_changed`, naming the fields and the
world to `reopen`), and the
session made back as the parking would hand it over: its journal (`journal_from_world`), its
options (the manifest and `session.json`), its chunk count. No replica holds it: its first call
on each deployment finds the session gone and rebuilds it from the journal (history/
recovery.py: the DiT's `restore`, one cache update per chunk, and the VAE's replay), as after a
replica's loss, and the session continues byte-identical. It carries frame replies of its last
`sessions.resume.replay_chunks` stored chunks (replays.py): a resume with `resume_from` sends
the client those it had not acknowledged again, as a parked session's.
"""
from __future__ import annotations

import asyncio
from typing import Optional

from deployments.errors import SessionLost
from deployments.ingress.parking import ParkedSession, token_digest
from deployments.ingress.worlds.changes import world_changed
from deployments.ingress.worlds.keeping import WorldKeeping, world_of_token
from deployments.ingress.worlds.replays import stored_replies
from deployments.ingress.worlds.spill import WorldSpill
from deployments.wire import SessionOptions, owner_tag, routing_key
from deployments.worlds.errors import BadWorldKey, StoreUnavailable, WorldError, WorldNotFound
from deployments.worlds.journal_parts import journal_from_world
from deployments.worlds.manifest import served_model

MIB = 1024 * 1024


async def revive(keeping: WorldKeeping, principal: str, session_id: str, token: str) -> Optional[ParkedSession]:
    """The session `token` resumes, from the store (None: the store has no such session of this
    principal, or it is another session's). Raises SessionLost (the store is down, the world is
    damaged or cannot be rebuilt) or WorldChanged."""
    args = keeping.args
    try:
        session, world = await asyncio.to_thread(keeping.load_session, principal, world_of_token(token_digest(token)))
    except (WorldNotFound, BadWorldKey):
        return None
    except StoreUnavailable:
        raise SessionLost("the world store that keeps this session did not answer; try again shortly") from None
    except WorldError as e:
        raise SessionLost(f"this session's world in the store cannot be read ({e.code}); start it again") from None
    if session.get("session_id") != session_id or not isinstance(session.get("image_digest"), str):
        return None
    m = world.manifest
    changed = world_changed(m.world_id, m.model, served_model(args), "this session")
    if changed is not None:  # field by field, with the world to `reopen` (reopen.py)
        raise changed
    if not args.sessions.recovery or world.context is None:
        raise SessionLost("this server does not rebuild sessions (sessions.recovery is off); start it again")
    world_id = world_of_token(token_digest(token))  # a journal over its budget leaves its chunks there
    journal = journal_from_world(world, int(args.sessions.journal_max_mib * MIB),
                                 WorldSpill(keeping.worlds, principal, world_id))
    if not journal.recoverable:
        raise SessionLost("this session is larger than sessions.journal_max_mib: it cannot be rebuilt here")
    spec = SessionOptions(session_id=session_id, prompt=m.prompt, image_digest=session["image_digest"],
                          resolution=(m.height, m.width), seed=m.seed, total_latent_frames=m.total_latent_frames,
                          translation_scale=m.translation_scale, intrinsics_resolution=m.intrinsics_resolution,
                          raw_frames=bool(session.get("clip")), owner=owner_tag(principal))
    n = len(world.chunks)
    key = routing_key(session_id, spec.owner)  # no replica holds it: its first calls rebuild it (recovery.py)
    replies = stored_replies(world, session_id, token, args.sessions.resume.replay_chunks, spec.raw_frames)
    return ParkedSession(spec=spec, journal=journal, image=world.image, key=key, dit_key=key, vae_key=key,
                         next_chunk=n, sent=n, prompt=journal.prompt_after(n, m.prompt), replies=replies,
                         token_digest=token_digest(token))
