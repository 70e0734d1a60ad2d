// Sharing the live session (PROTOCOL.md "share / unshare"): `share` makes it a world others
// watch, answered `shared {world_id, watch_token, ...}`; `unshare` revokes the token at once.
// The page's link is `<origin>/w/<world_id>#token=<watch_token>`: the token rides in the URL's
// fragment, which a browser never sends to a server (the viewer page sends it in its `watch`
// message, viewer.js).
//
// The server answers requests in order, so a `share` sent while k infers are in flight is
// answered after their k replies (frames, or errors): an error reply that comes once those
// are in is the refusal of the share (or unshare), not of a chunk, and does not stop the stream.
//
// The page shares with `notify_players`: the server then sends the world's `players` unasked
// (`notice: true`) whenever its viewers or roles change; the owner's `grant`, `revoke`, `kick`
// and `pass_controls` (`players(...)`) are answered `players` too. Each goes to `onPlayers`
// (players_panel.js shows them).

import { encode } from "./msgpack.js";

const NOTICES = new Set(["store_behind", "yielded"]); // error replies that answer no request

/** `<base>w/<world_id>#token=<watch_token>`: the viewer page's link (base: the page's server). */
export function shareLink(base, worldId, token) {
  const url = new URL(`w/${encodeURIComponent(worldId)}`, base);
  url.hash = `token=${encodeURIComponent(token)}`;
  return url.toString();
}

/** The `share` / `unshare` requests (and the owner's players' ones) of one LiveStream, and their answers. */
export class ShareRequests {
  constructor(stream) {
    this.stream = stream;
    this.pending = []; // {kind, before: infer replies due first, resolve, reject}, in request order
    this.shared = null; // the last `shared` answer of the current session
    this.onPlayers = () => {}; // (players): an answered or unasked `players` of the session's world
  }

  /** Send `share` (`controls`: who drives, `owner` | `turns` | `crowd`: PROTOCOL.md "Players");
   *  resolves with the `shared` answer, rejects with an Error whose `code` is the server's. */
  share({ audience = "link", controls = "owner" } = {}) {
    return this.send({ endpoint: "share", audience, controls, notify_players: true }, "shared");
  }

  /** The owner's request about a viewer of its world (`grant` {viewer_id, director}, `revoke`,
   *  `kick`, `pass_controls` {viewer_id absent: back to the owner}); resolves with `players`. */
  players(endpoint, fields = {}) {
    return this.send({ endpoint, ...fields }, "players");
  }

  /** Send `unshare`; resolves with the `unshared` answer (its token opens nothing any more). */
  unshare() {
    return this.send({ endpoint: "unshare" }, "unshared");
  }

  send(fields, kind) {
    const s = this.stream;
    if (s.ws === null || s.ws.readyState !== WebSocket.OPEN || s.state !== "streaming") {
      return Promise.reject(Object.assign(new Error("no session is streaming"), { code: "client" }));
    }
    if (s.undoTo !== null) {
      return Promise.reject(Object.assign(new Error("an Undo is under way; try again once it is done"), { code: "client" }));
    }
    return new Promise((resolve, reject) => {
      this.pending.push({ kind, before: s.stats.inFlight, resolve, reject });
      s.ws.send(encode({ ...fields, session_id: s.sessionId }));
    });
  }

  /** An infer was answered (its frame, or an error): one reply fewer before the share's. */
  inferAnswered() {
    for (const p of this.pending) if (p.before > 0) p.before -= 1;
  }

  /** A reply of the session: true when it answered a pending share or unshare (taken here). */
  take(msg) {
    if (msg.type === "players" && msg.notice) { this.onPlayers(msg); return true; } // unasked: out of order
    const p = this.pending[0];
    if (p === undefined) return false;
    if (msg.type === p.kind && msg.type === "players") {
      this.pending.shift();
      this.onPlayers(msg);
      p.resolve(msg);
      return true;
    }
    if (msg.type === "shared" || msg.type === "unshared") {
      this.pending.shift();
      this.shared = msg.type === "shared" ? msg : null;
      p.resolve(msg);
      return true;
    }
    if (msg.type === "error" && p.before === 0 && msg.session_id === this.stream.sessionId && !NOTICES.has(msg.code)
        && msg.chunks_left === undefined) {
      this.pending.shift();
      p.reject(Object.assign(new Error(msg.message), { code: msg.code }));
      return true;
    }
    return false;
  }

  /** The socket closed: nothing pending is answered any more (a share made stays: the world
   *  waits for the session's resume). */
  dropped(why) {
    for (const p of this.pending.splice(0)) p.reject(Object.assign(new Error(why), { code: "connection" }));
  }

  /** The session ended (reset, a new one): its world ended with it on the server. */
  forget() {
    this.dropped("the session ended");
    this.shared = null;
  }
}
