"""`sharing`: worlds people share (deployments/ingress/sharing/, PROTOCOL.md "Shared worlds").

Kept beside deployments/config.py, which nests it in `AppArgs` as `sharing`.
"""
from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class SharingArgs(BaseModel):
    """`enabled`: the WorldHub deployment runs and `share` is served (else `share` is refused).
    A world has at most `max_viewers` viewers; one principal (API key, or address without auth)
    holds at most `max_views_per_principal` viewer sockets at once (of any worlds); one address joins at most
    `joins_per_minute` times a minute (`busy` beyond each). The hub keeps a world's last
    `hub_chunks` chunks (a feed that fell behind skips to them); each viewer's socket queues at
    most `viewer_queue_chunks` chunks (a slower viewer skips whole chunks). A world whose owner
    is neither heard (chunks or its keep-alive every `owner_keepalive_s`) for `owner_timeout_s`,
    nor parked for a resume, ends. Players (policy.py): in `turns`, a player holding the controls
    that sends no `control` for `turn_idle_s` loses them to the next player waiting (or to the
    owner); in `crowd`, a player silent that long stops voting. With auth on, a viewer presents
    an API key like any client, unless `anonymous_viewers`: then a viewer without a key (none
    presented; a wrong key is still refused) watches `link` shares as its address; `principal`
    shares never admit it. A `watch`'s `catch_up` gives at most `hub_chunks` chunks. A viewer's
    socket sends at most `viewer_messages_per_s` messages a second (`viewer_message_burst` at
    once): one over it is answered `busy` and not read; one that keeps flooding is closed
    (sharing/pace.py)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    enabled: bool = True
    max_viewers: int = Field(64, ge=1)
    max_views_per_principal: int = Field(8, ge=1)
    joins_per_minute: float = Field(30.0, gt=0)
    hub_chunks: int = Field(4, ge=1)
    viewer_queue_chunks: int = Field(2, ge=1)
    owner_keepalive_s: float = Field(5.0, gt=0)
    owner_timeout_s: float = Field(20.0, gt=0)
    turn_idle_s: float = Field(15.0, gt=0)
    anonymous_viewers: bool = False
    viewer_messages_per_s: float = Field(30.0, gt=0)
    viewer_message_burst: int = Field(60, ge=1)
