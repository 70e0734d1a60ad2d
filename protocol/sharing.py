"""Worlds people share (PROTOCOL.md, "Shared worlds" and "Players"): the owner's requests
(`share`, `unshare`, `grant`, `revoke`, `kick`, `pass_controls`) and their answers, the
viewer's side of `/v1/realtime/world/watch` (its `watch` request, `watching`, the world's
notices) and a player's requests there (`ask_controls`, `pass_controls`, `prompt`).
protocol/messages.py puts the requests in the camera route's REQUEST_TYPES."""
from __future__ import annotations

from typing import Annotated, Literal, Optional

from pydantic import Field, JsonValue, Strict, ValidationInfo, field_validator

from protocol.fields import _check_prompt, _Message, _Request

MAX_WORLD_ID_CHARS = 64
MAX_WATCH_TOKEN_CHARS = 128
Audience = Literal["principal", "link"]
Controls = Literal["owner", "turns", "crowd"]  # who drives (PROTOCOL.md "Players")
WorldId = Annotated[str, Strict(), Field(min_length=1, max_length=MAX_WORLD_ID_CHARS)]
WatchToken = Annotated[str, Strict(), Field(min_length=1, max_length=MAX_WATCH_TOKEN_CHARS)]
WorldEvent = Literal["viewers", "owner_reconnecting", "owner_back", "ended", "controls", "kicked", "prompt", "paused",
                     "resumed"]
MAX_VIEWER_ID_CHARS = 64
ViewerId = Annotated[str, Strict(), Field(min_length=1, max_length=MAX_VIEWER_ID_CHARS)]
MAX_CATCH_UP = 64  # a `watch`'s `catch_up` at most (the server gives at most `sharing.hub_chunks`)


class Shared(_Message):
    """The answer to `share`: the world viewers watch, where and with which token."""

    type: Literal["shared"] = "shared"
    session_id: str
    world_id: str = Field(description="the shared world's id (one share of one session)")
    watch_url: str = Field(description="the watch route's path with `?world=<world_id>` (no token in it): "
                                       "a viewer opens it and sends `watch` with the token")
    watch_token: str = Field(description="the world's secret (>= 128 bits): whoever holds it may watch, within "
                                         "the share's `audience`; `unshare` and the world's end revoke it")
    audience: Audience
    controls: Controls
    show_prompt: bool = Field(False, description="viewers get the prompt (`watching`, `world` notices `prompt`)")


class Unshared(_Message):
    """The answer to `unshare`: the world's token is revoked, its viewers got `ended`."""

    type: Literal["unshared"] = "unshared"
    session_id: str
    world_id: Optional[str] = Field(None, description="the world that ended (absent: the session was not shared)")


class WatchRequest(_Message):
    """The first message on `/v1/realtime/world/watch`: the world to watch and its token."""

    endpoint: Literal["watch"] = "watch"
    world_id: WorldId
    watch_token: WatchToken
    catch_up: Annotated[int, Strict()] = Field(0, ge=0, le=MAX_CATCH_UP, description="the world's last K chunks first (the current one the "
                          "last of them), then live; 0 or 1: the current one only. At most `sharing.hub_chunks` "
                          "are given (more asks for every chunk the server keeps)")


class Watching(_Message):
    """The answer to `watch`: frame replies of the world follow (the first one starts with the
    init segment), then its notices as they come."""

    type: Literal["watching"] = "watching"
    world_id: str
    viewers: int = Field(ge=0, description="viewers of the world now, this one included")
    controls: Controls
    next_chunk_id: Optional[int] = Field(None, ge=0, description="the first chunk this viewer gets: the world's "
                                                                 "last one made so far, or with `catch_up` the "
                                                                 "oldest of those it gets first (absent: none yet)")
    viewer_id: Optional[str] = Field(None, description="this viewer's name in the world: the owner grants, revokes, "
                                                       "kicks and passes the controls by it; `controls` lists it")
    holder: Optional[str] = Field(None, description="who holds the controls now: `owner` or a player's viewer_id "
                                                    "(absent in `crowd`: the players' votes drive)")
    players: list[str] = Field(default_factory=list, description="the world's players (viewer ids) now")
    paused: bool = Field(False, description="the owner's drive is paused now (`world` notices `paused`, `resumed`)")
    prompt: Optional[str] = Field(None, description="the prompt the world attends to now, only if its share has "
                                                    "`show_prompt` (text, as the owner sent it)")
    debug: Optional[dict[str, JsonValue]] = Field(None, description="with debug_fields: the ingress replica")


class WorldNotice(_Message):
    """Something happened to the world a viewer watches: `viewers` (the count changed),
    `owner_reconnecting` (the owner's socket dropped; the world waits for its resume),
    `owner_back`, `ended` (unshared, reset, or the owner did not come back: the socket closes),
    `controls` (who holds the controls or who plays changed: `holder`, `players`, `director`),
    `kicked` (to the viewer the owner removed only: the socket closes), `prompt` (the owner
    steered the prompt: the chunks after this notice attend to `prompt`; only with the share's
    `show_prompt`), `paused` (the owner's drive paused: no key held) and `resumed` (its next
    chunk follows)."""

    type: Literal["world"] = "world"
    world_id: str
    event: WorldEvent
    viewers: int = Field(ge=0)
    reason: Optional[str] = Field(None, description="with `ended` or `kicked`: why")
    holder: Optional[str] = Field(None, description="with `controls`: `owner` or the player's viewer_id holding the "
                                                    "controls (absent in `crowd`: the players' votes drive)")
    players: list[str] = Field(default_factory=list, description="with `controls`: the players' viewer ids")
    director: Optional[str] = Field(None, description="with `controls`: the player whose `prompt` steers, if any")
    prompt: Optional[str] = Field(None, description="with `prompt`: the new prompt (text: show it as text, never "
                                                    "as markup)")


class Players(_Message):
    """The answer to the owner's `grant`, `revoke`, `kick` and `pass_controls`: its world's players now.
    With the share's `notify_players`, the owner's socket also gets one unasked (`notice: true`)
    whenever its world's viewers or roles change (a viewer joins, leaves or asks for the
    controls; a turn passes...)."""

    type: Literal["players"] = "players"
    session_id: str
    world_id: str
    controls: Controls
    holder: Optional[str] = Field(None, description="`owner` or the player holding the controls (absent in `crowd`)")
    players: list[str] = Field(default_factory=list, description="the players' viewer ids")
    director: Optional[str] = None
    viewers: Optional[int] = Field(None, ge=0, description="viewers of the world now")
    viewer_ids: list[str] = Field(default_factory=list, description="every viewer's id, in the order they joined "
                                                                    "(the players among them)")
    version: Optional[int] = Field(None, ge=0, description="the world's roles' version: a `players` with a larger "
                                                           "one is newer (keep the newest)")
    notice: bool = Field(False, description="true: sent unasked (the world's viewers or roles changed); absent: "
                                            "the answer to the owner's request")


class ShareRequest(_Request):
    """Share the open session as a world others watch (`/v1/realtime/world/watch`); the reply
    is `shared`. Sharing a shared session again answers the same world."""

    endpoint: Literal["share"] = "share"
    audience: Audience = Field("link", description="`link`: whoever holds the token (with auth on, with a valid "
                                                   "key); `principal`: only the owner's API key (or address)")
    controls: Controls = Field("owner", description="who drives: `owner` (only the owner), `turns` (one player holds "
                                                    "the controls; others ask), `crowd` (the players' keys merged "
                                                    "per chunk, majority per key)")
    show_prompt: bool = Field(False, description="viewers get the prompt the world attends to, and a `world` notice "
                                                 "`prompt` at each prompt update (default: they never see it)")
    notify_players: bool = Field(False, description="this socket gets a `players` unasked (`notice: true`) whenever "
                                                    "the world's viewers or roles change, and one now (default: "
                                                    "`players` only answers the owner's requests)")


class UnshareRequest(_Request):
    """End the session's share: its token is revoked, its viewers get `ended`. The reply is `unshared`."""

    endpoint: Literal["unshare"] = "unshare"


class AskControlsRequest(_Request):
    """A viewer's, on the watch route (`session_id`: the world's id): become a player of a
    `turns` or `crowd` world (in `turns`, wait for a turn). The `controls` notice answers it."""

    endpoint: Literal["ask_controls"] = "ask_controls"


class PassControlsRequest(_Request):
    """Pass the controls of a `turns` world: the owner's (`session_id`: its session) or the
    holder's (on the watch route, `session_id`: the world's id). The owner gets `players`."""

    endpoint: Literal["pass_controls"] = "pass_controls"
    viewer_id: Optional[ViewerId] = Field(None, description="the player who gets them; absent: the owner")


class GrantRequest(_Request):
    """The owner makes a viewer of its session's world a player (`director`: its `prompt` steers
    too). The reply is `players`."""

    endpoint: Literal["grant"] = "grant"
    viewer_id: ViewerId = Field(description="the viewer's id (its `watching`, `controls` notices)")
    director: bool = Field(False, description="the player's `prompt` steers the world (one director at a time)")


class RevokeRequest(_Request):
    """The owner takes a player's role back (it holds no controls, casts no vote, steers no
    prompt; it still watches). The reply is `players`."""

    endpoint: Literal["revoke"] = "revoke"
    viewer_id: ViewerId


class KickRequest(_Request):
    """The owner removes a viewer from its world: its socket gets a `kicked` notice and closes;
    its key (or address) cannot watch the world again. The reply is `players`."""

    endpoint: Literal["kick"] = "kick"
    viewer_id: ViewerId


class PromptRequest(_Request):
    """The director's prompt steering, on the watch route (`session_id`: the world's id): the
    world's next chunk attends to `prompt` (as the owner's `prompt_update`)."""

    endpoint: Literal["prompt"] = "prompt"
    prompt: Annotated[str, Strict()]

    @field_validator("prompt")
    @classmethod
    def _prompt(cls, v: str, info: ValidationInfo) -> str:
        return _check_prompt(v, info)
