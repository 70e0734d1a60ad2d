// One WebSocket to /v1/realtime/world/camera and the live session on it (PROTOCOL.md).
// An ES module another page can import to show a session in its own <video> (web/README.md:
// the API, the server URL, CORS and the origin check; web/examples/embed.html):
//
//   import { LiveStream } from "http://127.0.0.1:8000/static/stream.js";
//   const stream = new LiveStream(document.querySelector("video"));   // server: where this file came from
//   await stream.start({ image: pngBytes, prompt: "a street" });       // then stream.keys.keyDown("KeyW")
//
// Camera: the keys held go to the server as `control` messages (camera.js) and every chunk is
// an infer with `from_keys`: the server integrates the keys into the chunk's poses, and each
// frame echoes the `event_id` of the key state it shows; the control lag is the time from a
// control to the first frame that echoes it (or a later one).
//
// Pacing: the next chunk is requested while the current one plays, so that about one chunk of
// video is always waiting (one request in flight at most). When chunks come slower than 16 fps
// the video plays at the rate they arrive (playback.js), without freezing and jumping.
//
// Undo: `rewind` to the last chunk received (once no chunk is in flight): the server's next
// infer produces that chunk again, and the player drops it (and any chunk in flight then).
//
// Resume: when the socket drops while streaming and the server offers it (handshake
// `resume_grace_s`, the session's `resume_token`), a new socket sends `resume` with the count of
// frames it has; the missed frames come again, then `resumed` says which chunk to request next.
// Share: `stream.shares.share({audience, controls})` / `.unshare()` (share.js): a world others watch by link.
// Fork of a shared world: fork.js `forkWorld(stream, worldId, token)`: the page's session becomes the fork.

import { encode, decode } from "./msgpack.js";
import { KeyControl, CHUNK_FRAMES, TRANSLATION_SCALE } from "./camera.js";
import { MsePlayer, codecFromInit } from "./player.js";
import { RatePacer } from "./playback.js";
import { nextStep } from "./sizes.js";
import { MODULE_SERVER, cameraUrl, keyProtocols } from "./server.js";
import { statsDetail } from "./stats.js";
import { onQueued, rejoinLine, resumeAfterDrop } from "./reconnect.js";
import { ShareRequests } from "./share.js";

export { CAMERA_PATH, MODULE_SERVER, cameraUrl, keyProtocols, watchUrl } from "./server.js";
export { CONTROL_CODES } from "./camera.js"; // the KeyboardEvent.code values `stream.keys` takes
export { MsePlayer } from "./player.js"; // MsePlayer.supported(): can this browser play the stream

const FPS = 16;
const FIRST_CHUNK_FRAMES = 9;
const AHEAD_S = CHUNK_FRAMES / FPS; // request the next chunk once less than this is left to play
const TICK_MS = 100;

/**
 * A live session shown in a `<video>` (Media Source Extensions), driven by the keys held.
 *
 * Events (it is an EventTarget; each a CustomEvent, the fields in `detail`):
 * - "state" {state}: "disconnected" | "connecting" | "idle" | "starting" | "streaming" | "resuming" | "stopped"
 * - "status" {text, level}: a sentence for the user; level "info" | "warn" | "error"
 * - "stats" {chunks, frames, inFlight, ttfc, fps, p50, p95, controlLag, resolution, cached, canUndo, ...}
 * - "error" {code, message}: the server's error code (PROTOCOL.md) or "connection" | "player" | "client"
 * - "queued" {position, eta_s}: the server is full and the session waits in its line (1: next)
 *
 * Input: `stream.keys` (camera.js KeyControl): `keyDown(code)` / `keyUp(code)` with
 * KeyboardEvent.code values (`CONTROL_CODES`: WASD, Q/E, IJKL, arrows), `drag(dx, dy)` in
 * pixels, `releaseAll()`. Read-only: `state`, `config` (the server's handshake), `stats`.
 */
export class LiveStream extends EventTarget {
  /**
   * @param {HTMLVideoElement} video where the session plays
   * @param {{server?: string, apiKey?: string}} [options] `server`: the server's base URL
   *   (http(s):// or ws(s)://; default: the server this module was loaded from); `apiKey`:
   *   the key `connect` and `start` send when given none (as the subprotocol `lwf.bearer.<key>`)
   */
  constructor(video, { server = MODULE_SERVER, apiKey = "" } = {}) {
    super();
    this.server = server;
    this.apiKey = apiKey;
    this.player = new MsePlayer(video);
    this.player.onerror = (e) => this.fail("player", e.message);
    this.keys = new KeyControl((eventId, keys) => this.sendControl(eventId, keys));
    this.pacer = new RatePacer();
    this.undoTo = null; // the chunk an Undo takes the session back to (pending until `rewound`)
    this.rewindSent = false;
    this.ws = null;
    this.config = null;
    this.state = "disconnected"; // disconnected | connecting | idle | starting | streaming | resuming | stopped
    this.resumeToken = null;
    this.resumeWaiter = null; // {resolve, reject} of the `resume` in flight
    this.timer = null;
    this.replies = Promise.resolve(); // replies are handled one after the other, in order
    this.shares = new ShareRequests(this); // share / unshare of the session (share.js)
    this.intercept = null; // (msg) => true when it took the reply: a request of worlds.js or fork.js waiting for its answer
    this.resetStats();
  }

  resetStats() {
    this.stats = { chunks: 0, frames: 0, inFlight: 0, ttfc: null, intervals: [], lastAt: null,
                   sentAt: null, lastFps: null, resolution: null, lags: [], lastEventId: null,
                   cached: 0, lastCached: false };
    if (this.pacer) this.pacer.reset();
  }

  setState(state) {
    this.state = state;
    this.dispatchEvent(new CustomEvent("state", { detail: { state } }));
  }

  status(text, level = "info") {
    this.dispatchEvent(new CustomEvent("status", { detail: { text, level } }));
  }

  /**
   * Open the socket and wait for the handshake (`resuming`: keep the session's state).
   * @param {string} [apiKey] default: the constructor's
   * @returns {Promise<object>} the handshake (`config`: model, sizes, limits); rejects with an
   *   Error whose `code` is the server's (e.g. "unauthorized"), "connection", or "client" (a key no
   *   subprotocol can carry: `keyProtocols`)
   */
  connect(apiKey = this.apiKey, resuming = false) {
    this.apiKey = apiKey;
    let protocols;
    try {
      protocols = keyProtocols(apiKey); // the key travels as a subprotocol, never in the URL
    } catch (e) {
      return Promise.reject(e);
    }
    if (!resuming) {
      this.setState("connecting");
      this.status("Connecting…");
    }
    return new Promise((resolve, reject) => {
      const ws = new WebSocket(cameraUrl(this.server), protocols);
      ws.binaryType = "arraybuffer";
      this.ws = ws;
      let opened = false;
      ws.onmessage = (ev) => {
        let msg;
        try {
          msg = decode(new Uint8Array(ev.data));
        } catch (e) {
          this.fail("bad_message", `undecodable reply from the server: ${e.message}`);
          return;
        }
        if (!opened && msg.type === "config") {
          opened = true;
          this.config = msg;
          if (!resuming) {
            this.setState("idle");
            this.status(`Connected to ${msg.model}. Press Start.`);
          }
          resolve(msg);
        } else if (!opened && msg.type === "error") {
          reject(Object.assign(new Error(msg.message), { code: msg.code }));
        } else {
          this.replies = this.replies.then(() => this.onReply(msg)).catch((e) => this.fail("client", e.message));
        }
      };
      ws.onclose = (ev) => {
        if (this.ws === ws) this.ws = null;
        this.stopTimer();
        this.shares.dropped("the connection closed");
        const was = this.state;
        const why = `code ${ev.code}${ev.reason ? `: ${ev.reason}` : ""}`;
        if (was === "resuming") { // a resume's socket: its attempt failed
          if (!opened) reject(Object.assign(new Error(`cannot connect to the server (${why})`), { code: "connection" }));
          else if (this.resumeWaiter) this.resumeWaiter.reject(new Error(`connection lost (${why})`));
          return;
        }
        if (opened && (was === "idle" || was === "stopped")) {
          // No session on it: the server closes a socket that sends nothing within its handshake
          // deadline (connection.first_message_timeout_s) or idles after a session. Nothing is
          // lost; Start opens a new one.
          return;
        }
        if (opened && was === "streaming" && this.canResume()) {
          resumeAfterDrop(this, why); // reconnect.js
          return;
        }
        if (opened && was === "starting" && this.queueToken) { // dropped while in line: its place again
          rejoinLine(this, why);
          return;
        }
        this.setState("disconnected");
        if (!opened) reject(Object.assign(new Error(`cannot connect to the server (${why})`), { code: "connection" }));
        else if (was !== "disconnected") this.fail("connection", `connection lost (${why}); press Start to reconnect`);
      };
    });
  }

  canResume() {
    return Boolean(this.resumeToken && this.config && this.config.resume_grace_s > 0);
  }

  onResumed(msg) {
    if (msg.session_id !== this.sessionId || this.state !== "resuming") return;
    this.nextChunk = msg.next_chunk_id;
    this.stats.inFlight = 0;
    this.setState("streaming");
    this.status(`Resumed the session at chunk ${msg.next_chunk_id} (${msg.replayed} sent again).`);
    this.startTimer();
    if (this.resumeWaiter) this.resumeWaiter.resolve(true);
  }

  /**
   * Start a new session (connecting first when no socket is open); it streams until `reset`.
   * @param {{image: Uint8Array, prompt: string, seed?: number, size?: string}} options the start
   *   image's PNG or JPEG bytes, the prompt, and optionally a seed and a size ("H*W", one the
   *   handshake's `config.sizes` lists)
   * @param {string} [apiKey] default: the constructor's
   */
  async start(options, apiKey = this.apiKey) {
    if (this.ws === null || this.ws.readyState !== WebSocket.OPEN) await this.connect(apiKey);
    this.options = options;
    this.resumeToken = null;
    this.queueToken = this.queued = null;
    this.sessionId = `web-${Math.random().toString(36).slice(2, 10)}`;
    this.shares.forget(); // the last session's world ended with it
    this.keys.reset();
    this.undoTo = null;
    this.player.close();
    this.resetStats();
    this.nextChunk = 0;
    this.setState("starting");
    this.stats.startedAt = performance.now();
    this.status("Starting the session…");
    this.sendChunk();
    this.startTimer();
  }

  /** Prompt steering: the next chunk carries `prompt_update` (the scene is kept). */
  steer(prompt) {
    if (this.nextChunk === 0 || !prompt) return false;
    this.pendingPrompt = prompt;
    return true;
  }

  /** One `control`: the keys held now (the whole state) for this session. */
  sendControl(eventId, keys) {
    if (this.ws === null || this.ws.readyState !== WebSocket.OPEN || !this.sessionId) return false;
    if (this.state !== "starting" && this.state !== "streaming") return false; // no session runs
    this.ws.send(encode({ endpoint: "control", session_id: this.sessionId, event_id: eventId, keys }));
    return true;
  }

  /** Build and send the next infer, its camera from the keys held (image, prompt and options on the first one). */
  sendChunk() {
    this.keys.beforeChunk(); // the drag since the last chunk -> look keys, sent before the infer
    const msg = { endpoint: "infer", session_id: this.sessionId, client_chunk_id: this.nextChunk, from_keys: true };
    if (this.nextChunk === 0) {
      const o = this.options;
      Object.assign(msg, { image: o.image, prompt: o.prompt, seed: o.seed, size: o.size,
                           translation_scale: TRANSLATION_SCALE, queue_token: this.queueToken || undefined });
      this.pendingPrompt = null;
    } else if (this.pendingPrompt) {
      msg.prompt_update = this.pendingPrompt;
      this.pendingPrompt = null;
    }
    this.stats.sentAt = performance.now();
    this.nextChunk += 1;
    this.stats.inFlight += 1;
    this.ws.send(encode(msg));
    this.keys.afterChunk();
    this.emitStats();
  }

  /** Undo: take the last chunk received back (the server regenerates it from the keys held
   *  then). False when there is nothing to undo (the first chunk stays: Reset starts over). */
  undo() {
    if (this.state !== "streaming" || this.undoTo !== null || this.stats.chunks < 2) return false;
    this.undoTo = this.stats.chunks - 1;
    this.rewindSent = false;
    this.status(`Undoing chunk ${this.undoTo}…`);
    this.tick();
    return true;
  }

  tick() {
    this.player.pump();
    this.player.setRate(this.pacer.update(this.player.bufferedAhead()));
    this.emitStats();
    if (this.state !== "streaming" || this.stats.inFlight > 0) return;
    if (this.undoTo !== null) { // wait for the chunk in flight, then rewind
      if (!this.rewindSent) {
        this.rewindSent = true;
        this.ws.send(encode({ endpoint: "rewind", session_id: this.sessionId, to_chunk: this.undoTo }));
      }
      return;
    }
    if (this.player.bufferedAhead() <= AHEAD_S) this.sendChunk();
  }

  /** Seconds of video before chunk k (9 frames, then 12 per chunk). */
  static chunkStart(k) {
    return k === 0 ? 0 : (FIRST_CHUNK_FRAMES + CHUNK_FRAMES * (k - 1)) / FPS;
  }

  onRewound(msg) {
    if (msg.session_id !== this.sessionId || this.undoTo === null) return;
    const k = msg.next_chunk_id;
    this.player.dropFrom(LiveStream.chunkStart(k));
    this.stats.chunks = k;
    this.stats.frames = k === 0 ? 0 : FIRST_CHUNK_FRAMES + CHUNK_FRAMES * (k - 1);
    this.nextChunk = k;
    this.undoTo = null;
    this.status(`Chunk ${k} taken back; the next one continues from chunk ${k - 1}.`);
    this.tick();
  }

  onReply(msg) {
    if (this.shares.take(msg)) return; // the answer to a share or unshare (share.js)
    if (this.intercept && this.intercept(msg)) return; // a reply worlds.js (save, open) or fork.js waits for
    if (msg.type === "frame") return this.onFrame(msg);
    if (msg.type === "reset_ok") return;
    if (msg.type === "resumed") return this.onResumed(msg);
    if (msg.type === "rewound") return this.onRewound(msg);
    if (msg.type === "error") return this.onError(msg);
    if (msg.type === "queued") return onQueued(this, msg);
  }

  async onFrame(msg) {
    if (msg.session_id !== this.sessionId || this.state === "stopped") return; // a reset session
    if (msg.resume_token) this.resumeToken = msg.resume_token;
    const now = performance.now();
    const s = this.stats;
    s.inFlight = Math.max(0, s.inFlight - 1);
    this.shares.inferAnswered();
    s.lastFps = msg.num_frames / ((now - s.sentAt) / 1000); // frames per second of waiting for this chunk
    // a shared world's frame made from a player's (or the crowd's) input echoes that player's
    // event id, not this page's: only the owner's own frames show its keys (PROTOCOL.md "Players")
    const own = !msg.player || msg.player === "owner";
    if (own && msg.event_id !== undefined && msg.event_id !== null) {
      s.lastEventId = msg.event_id;
      for (const lag of this.keys.shown(msg.event_id, now)) s.lags.push(lag / 1000);
      if (s.lags.length > 200) s.lags.splice(0, s.lags.length - 200);
    }
    if (s.chunks > 0) this.pacer.arrived(msg.num_frames, (now - s.sentAt) / 1000); // chunk 0 carries the start-up
    if (s.chunks === 0) {
      s.ttfc = (now - s.sentAt) / 1000;
      s.resolution = msg.resolution;
      const mime = msg.mime_type || `video/mp4; codecs="${codecFromInit(msg.video) || "avc1.42E01E"}"`;
      this.setState("streaming");
      try {
        await this.player.open(mime);
      } catch (e) {
        this.fail("player", e.message);
        return;
      }
      this.status(`Streaming ${msg.resolution[0]}×${msg.resolution[1]} — drive with WASD, Q/E, arrows/IJKL or drag.`);
    } else {
      s.intervals.push((now - s.lastAt) / 1000);
    }
    s.lastAt = now;
    s.chunks += 1;
    s.frames += msg.num_frames;
    s.lastStages = msg.stage_durations;
    s.lastCached = msg.cached === true; // from the server's prefix store: an earlier session made it
    if (s.lastCached) s.cached += 1;
    this.player.append(msg.video);
    this.tick();
  }

  onError(msg) {
    const stale = msg.session_id && msg.session_id !== this.sessionId;
    if (stale || this.state === "stopped") return; // about a session that was reset or replaced
    if (msg.code === "store_behind") { // a notice: the server's world store lags; nothing failed
      this.status(`The server's world store is behind (${msg.message}); the stream goes on.`, "warn");
      return;
    }
    if (this.state === "resuming" && this.resumeWaiter) {
      if (msg.code === "unauthorized") this.resumeWaiter.resolve(false); // not parked yet: again
      else this.resumeWaiter.reject(Object.assign(new Error(`[${msg.code}] ${msg.message}`), { final: true }));
      return;
    }
    if (this.undoTo !== null && this.rewindSent && this.stats.inFlight === 0) { // the rewind's answer
      if (msg.code === "busy") { // a chunk was still in flight on the server: ask again
        setTimeout(() => { this.rewindSent = false; }, (msg.retry_after_s || 0.5) * 1000);
        return;
      }
      this.undoTo = null; // refused (e.g. no journal on this server): the session goes on as it was
      this.status(`Cannot undo (${msg.code}): ${msg.message}`, "warn");
      this.dispatchEvent(new CustomEvent("error", { detail: { code: msg.code, message: msg.message } }));
      this.tick();
      return;
    }
    if (msg.code === "yielded") { // a notice (answers no request): the session is kept, its next chunk waits in line
      this.status(`Your place went to someone waiting: ${msg.message}.`, "warn");
      return;
    }
    this.stats.inFlight = Math.max(0, this.stats.inFlight - 1);
    this.shares.inferAnswered();
    if (msg.code === "busy" && this.state === "starting") {
      const wait = msg.retry_after_s || 1;
      this.status(`Server busy: ${msg.message}. Retrying in ${wait} s…`, "warn");
      this.keys.reset();
      this.dispatchEvent(new CustomEvent("error", { detail: { code: msg.code, message: msg.message } }));
      setTimeout(() => {
        if (this.state !== "starting" || this.ws === null) return;
        this.nextChunk = 0;
        this.sendChunk();
      }, wait * 1000);
      return;
    }
    this.fail(msg.code, msg.message);
  }

  /** Stop on an error: said on the video with what to do next; nothing stays counted in flight. */
  fail(code, message) {
    this.stopTimer();
    if (this.state === "starting" || this.state === "streaming") this.setState("stopped");
    this.stats.inFlight = 0;
    this.undoTo = null;
    const next = nextStep(code, this.config);
    const hint = next && !/press start/i.test(message) ? ` ${next}` : "";
    this.status(`Error (${code}): ${message}.${hint}`.replace(/\.\./, "."), "error");
    this.dispatchEvent(new CustomEvent("error", { detail: { code, message } }));
    this.emitStats();
  }

  /** Stop the session: send reset (the server drops its state); the video stays on screen. */
  reset() {
    this.stopTimer();
    this.undoTo = null;
    if (this.ws !== null && this.ws.readyState === WebSocket.OPEN && this.sessionId) {
      this.ws.send(encode({ endpoint: "reset", session_id: this.sessionId }));
    }
    if (this.state !== "disconnected") this.setState("stopped");
    this.stats.inFlight = 0;
    this.shares.forget();
    this.status("Session reset. Press Start for a new one.");
    this.emitStats();
  }

  /** Reset the session, if one runs, and close the socket (state "disconnected"). */
  close() {
    if (this.state === "starting" || this.state === "streaming" || this.state === "resuming") this.reset();
    const ws = this.ws;
    this.setState("disconnected");
    if (ws !== null) ws.close(1000, "closed by the page");
  }

  /** Tick every TICK_MS (pump the player, pace the requests), in place of any timer running. */
  startTimer() {
    this.stopTimer();
    this.timer = setInterval(() => this.tick(), TICK_MS);
  }

  stopTimer() {
    if (this.timer !== null) clearInterval(this.timer);
    this.timer = null;
  }

  emitStats() {
    this.dispatchEvent(new CustomEvent("stats", { detail: statsDetail(this) }));
  }
}
