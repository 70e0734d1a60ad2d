// One viewer's socket to the watch route `/v1/realtime/world/watch` (PROTOCOL.md "The watch
// route") and the world it shows in a `<video>`. An ES module another page can import, as
// stream.js:
//
//   import { WorldWatch } from "http://127.0.0.1:8000/static/watch.js";
//   const watch = new WorldWatch(document.querySelector("video"));
//   await watch.watch(worldId, watchToken);            // the share's world_id and watch_token
//
// The socket carries the API key as its subprotocol (`lwf.bearer.<key>`), as the camera's
// does; the token goes in the first message (`watch`), never in a URL. The server answers
// `watching`, then the world's frame replies (the same fMP4 bytes as its owner's: the first
// starts with the init segment) and its notices (`world`: `viewers`, `owner_reconnecting`,
// `owner_back`, `ended`, and whatever other event the server adds, passed on as it comes; `ended`
// and `kicked` end the watch: state "ended", no "connection lost" when the socket closes).
//
// Playback: the chunks play one after the other ('sequence' mode, player.js), so a late join,
// a skipped chunk (a slow viewer's socket skips whole chunks) or the owner's Undo plays on
// without a gap; when chunks come slower than 16 fps the video plays at the rate they arrive
// (playback.js, from the time between two chunks).

import { encode, decode } from "./msgpack.js";
import { MsePlayer, codecFromInit } from "./player.js";
import { RatePacer } from "./playback.js";
import { MODULE_SERVER, keyProtocols, watchUrl } from "./server.js";

const TICK_MS = 100;

/**
 * A shared world watched in a `<video>`.
 *
 * Events (each a CustomEvent, the fields in `detail`):
 * - "state" {state}: "disconnected" | "connecting" | "watching" | "ended"
 * - "watching" the server's `watching` answer {world_id, viewers, controls, next_chunk_id}
 * - "world" a `world` notice {event, viewers, reason, ...}: every event, those of today and later ones
 * - "chunk" {chunkId, chunks, frames, skipped, resolution, player, eventId, voters}: a chunk arrived
 *   (`skipped`: chunks this viewer missed; `player`, `eventId`: whose input made a key-driven chunk,
 *   and its event id; `voters`: a `crowd` chunk's players whose votes made it)
 * - "error" {code, message}: the server's error code (PROTOCOL.md) or "connection" | "player" | "client"
 *
 * Read-only: `state`, `worldId`, `viewers`, `controls`, `chunks`, `frames`, `skipped`, `lastChunkId`.
 */
export class WorldWatch extends EventTarget {
  /**
   * @param {HTMLVideoElement} video where the world plays
   * @param {{server?: string, apiKey?: string}} [options] the server's base URL (default: the
   *   one this module came from) and the API key `watch` sends when given none
   */
  constructor(video, { server = MODULE_SERVER, apiKey = "" } = {}) {
    super();
    this.server = server;
    this.apiKey = apiKey;
    this.player = new MsePlayer(video);
    this.player.onerror = (e) => this.emit("error", { code: "player", message: e.message });
    this.pacer = new RatePacer();
    this.ws = null;
    this.state = "disconnected";
    this.timer = null;
    this.replies = Promise.resolve(); // handled one after the other, in order
    this.reset();
  }

  reset() {
    this.worldId = null;
    this.viewers = null;
    this.controls = null;
    this.chunks = 0;
    this.frames = 0;
    this.skipped = 0;
    this.lastChunkId = null;
    this.lastAt = null;
    this.ended = null; // the `ended` notice, once it came
    this.pacer.reset();
  }

  emit(type, detail) {
    this.dispatchEvent(new CustomEvent(type, { detail }));
  }

  setState(state) {
    this.state = state;
    this.emit("state", { state });
  }

  /**
   * Open the socket and watch `worldId` with its token.
   * @returns {Promise<object>} the `watching` answer; rejects with an Error whose `code` is the
   *   server's (`unauthorized`: a wrong, revoked or foreign token, or the key; `busy`: a limit,
   *   with `retryAfterS`), "connection", or "client" (a key no subprotocol can carry)
   */
  watch(worldId, token, apiKey = this.apiKey) {
    this.close();
    this.apiKey = apiKey;
    let protocols;
    try {
      protocols = keyProtocols(apiKey);
    } catch (e) {
      return Promise.reject(e);
    }
    this.player.close();
    this.reset();
    this.setState("connecting");
    return new Promise((resolve, reject) => {
      const ws = new WebSocket(watchUrl(this.server), protocols);
      ws.binaryType = "arraybuffer";
      this.ws = ws;
      let answered = false;
      ws.onopen = () => ws.send(encode({ endpoint: "watch", world_id: worldId, watch_token: token }));
      ws.onmessage = (ev) => {
        let msg;
        try {
          msg = decode(new Uint8Array(ev.data));
        } catch (e) {
          this.emit("error", { code: "bad_message", message: `undecodable reply from the server: ${e.message}` });
          return;
        }
        if (!answered && msg.type === "error") {
          answered = true;
          reject(Object.assign(new Error(msg.message), { code: msg.code, retryAfterS: msg.retry_after_s }));
        } else if (!answered && msg.type === "watching") {
          answered = true;
          this.onWatching(msg);
          resolve(msg);
        } else {
          this.replies = this.replies.then(() => this.onReply(msg))
            .catch((e) => this.emit("error", { code: "client", message: e.message }));
        }
      };
      ws.onclose = (ev) => {
        const why = `code ${ev.code}${ev.reason ? `: ${ev.reason}` : ""}`;
        if (!answered) {
          answered = true;
          reject(Object.assign(new Error(`cannot watch (${why})`), { code: "connection" }));
        }
        if (this.ws !== ws) return; // closed by the page (close, another watch)
        this.ws = null;
        this.stopTimer();
        if (this.ended === null && this.state === "watching") {
          this.emit("error", { code: "connection", message: `connection lost (${why})` });
        }
        if (this.state !== "ended") this.setState("disconnected");
      };
    });
  }

  onWatching(msg) {
    this.worldId = msg.world_id;
    this.viewers = msg.viewers;
    this.controls = msg.controls;
    this.setState("watching");
    this.emit("watching", msg);
    this.timer = setInterval(() => this.tick(), TICK_MS);
  }

  onReply(msg) {
    if (msg.type === "frame") return this.onFrame(msg);
    if (msg.type === "world") {
      if (typeof msg.viewers === "number") this.viewers = msg.viewers;
      if (msg.event === "ended" || msg.event === "kicked") { // (kicked: the owner removed this viewer)
        this.ended = msg;
        this.setState("ended");
      }
      this.emit("world", msg);
      return;
    }
    if (msg.type === "error") this.emit("error", { code: msg.code, message: msg.message });
  }

  async onFrame(msg) {
    const now = performance.now();
    if (!this.player.isOpen) {
      const mime = msg.mime_type || `video/mp4; codecs="${codecFromInit(msg.video) || "avc1.42E01E"}"`;
      try {
        await this.player.open(mime, { sequence: true });
      } catch (e) {
        this.emit("error", { code: "player", message: e.message });
        return;
      }
    } else {
      this.pacer.arrived(msg.num_frames, (now - this.lastAt) / 1000);
    }
    if (this.lastChunkId !== null && msg.chunk_id > this.lastChunkId + 1) {
      this.skipped += msg.chunk_id - this.lastChunkId - 1; // a slow socket skips whole chunks
    }
    this.lastChunkId = msg.chunk_id;
    this.lastAt = now;
    this.chunks += 1;
    this.frames += msg.num_frames;
    this.player.append(msg.video);
    this.emit("chunk", { chunkId: msg.chunk_id, chunks: this.chunks, frames: this.frames, skipped: this.skipped,
                         resolution: msg.resolution, player: msg.player, eventId: msg.event_id,
                         voters: Array.isArray(msg.voters) ? msg.voters : [] });
  }

  tick() {
    this.player.pump();
    this.player.setRate(this.pacer.update(this.player.bufferedAhead()));
  }

  /** Send one message on the viewer's socket (a map; e.g. a request the server adds for viewers). */
  send(fields) {
    if (this.ws === null || this.ws.readyState !== WebSocket.OPEN) return false;
    this.ws.send(encode(fields));
    return true;
  }

  stopTimer() {
    if (this.timer !== null) clearInterval(this.timer);
    this.timer = null;
  }

  /** Leave the world (the video stays on screen). */
  close() {
    this.stopTimer();
    const ws = this.ws;
    this.ws = null;
    if (this.state !== "ended") this.setState("disconnected");
    if (ws !== null) ws.close(1000, "closed by the page");
  }
}
