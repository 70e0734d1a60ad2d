// "Fork from here" (PROTOCOL.md, `fork` of a shared world): the viewer page (viewer.js) opens the
// main page at `<server>/#fork=<world_id>&token=<watch_token>` (and `&api_key=` when the viewer
// page has a key): a fragment, which a browser never sends to a server. The main page (app.js)
// reads it, clears it from the address bar, and on its camera socket sends
// `{endpoint: "fork", session_id: world_id, new_session_id, world_id, watch_token}`. The answer
// `forked` makes the new session the page's own: its `init_segment` opens the player, the
// video starts at the world's head (`next_chunk_id`: its fMP4 timestamps continue the world's),
// and the page goes on as after a `resume` (LiveStream.onResumed): it requests chunk
// `next_chunk_id` on, driven by the keys, with the session's `resume_token`.

import { encode } from "./msgpack.js";
import { codecFromInit } from "./player.js";
import { CHUNK_FRAMES } from "./camera.js";

const FIRST_CHUNK_FRAMES = 9; // as stream.js: chunk 0 has 9 frames, every later one 12

/** The main page's link that forks `worldId` (`base`: any URL of the viewer page, `<server>/w/<id>`). */
export function forkLink(base, worldId, token, apiKey = "") {
  const url = new URL("../", base);
  const fragment = new URLSearchParams({ fork: worldId, token });
  if (apiKey) fragment.set("api_key", apiKey);
  url.hash = fragment.toString();
  return url.toString();
}

/** The fork a page's fragment asks for, `{worldId, token}`, or null. */
export function forkOfFragment(fragment) {
  const worldId = fragment.get("fork"), token = fragment.get("token");
  return worldId && token ? { worldId, token } : null;
}

const framesBefore = (k) => (k === 0 ? 0 : FIRST_CHUNK_FRAMES + CHUNK_FRAMES * (k - 1));

/**
 * Fork the shared world `worldId` on `stream`'s socket (connecting first when none is open) and
 * go on with the new session; the page runs no session then (app.js: at boot).
 * @param {import("./stream.js").LiveStream} stream
 * @returns {Promise<object>} the `forked` answer; rejects with an Error whose `code` is the
 *   server's (`unauthorized`, `busy`, `session_lost`, `too_large`, ...) or "connection"
 */
export async function forkWorld(stream, worldId, token) {
  if (["starting", "streaming", "resuming"].includes(stream.state)) { // the fork would replace it on the server
    throw Object.assign(new Error("a session runs on this page: Reset it first"), { code: "client" });
  }
  if (stream.ws === null || stream.ws.readyState !== WebSocket.OPEN) await stream.connect();
  const sessionId = `web-${Math.random().toString(36).slice(2, 10)}`;
  stream.status("Forking the shared world: a session of your own from its last chunk…");
  const forked = await new Promise((resolve, reject) => {
    const ws = stream.ws;
    const closed = () => reject(Object.assign(new Error("the connection closed before the fork's answer"),
                                              { code: "connection" }));
    ws.addEventListener("close", closed, { once: true });
    stream.intercept = (msg) => { // the next reply about the new session answers the fork
      if (msg.session_id !== sessionId || (msg.type !== "forked" && msg.type !== "error")) return false;
      stream.intercept = null;
      ws.removeEventListener("close", closed);
      if (msg.type === "forked") resolve(msg);
      else reject(Object.assign(new Error(msg.message), { code: msg.code }));
      return true;
    };
    ws.send(encode({ endpoint: "fork", session_id: worldId, new_session_id: sessionId, world_id: worldId,
                     watch_token: token }));
  }).finally(() => { stream.intercept = null; });
  await continueFork(stream, forked);
  return forked;
}

/** The page's session is now the fork's: the player opened on its init segment at its head. */
async function continueFork(stream, forked) {
  const k = forked.next_chunk_id;
  stream.shares.forget(); // a session the page had ended on the server with the fork
  stream.sessionId = forked.session_id;
  stream.resumeToken = forked.resume_token || null;
  stream.queueToken = stream.queued = null;
  stream.keys.reset();
  stream.undoTo = null;
  stream.resetStats();
  const s = stream.stats;
  Object.assign(s, { chunks: k, frames: framesBefore(k), startedAt: performance.now(), lastAt: performance.now() });
  stream.nextChunk = k;
  const init = forked.init_segment;
  if (!init) throw Object.assign(new Error("the server sent no init segment for the fork"), { code: "client" });
  await stream.player.open(`video/mp4; codecs="${codecFromInit(init) || "avc1.42E01E"}"`);
  stream.player.append(init);
  stream.setState("streaming");
  stream.status(`Forked the shared world at chunk ${k}: your own session — drive with WASD, Q/E, arrows/IJKL or drag.`);
  stream.startTimer();
}
