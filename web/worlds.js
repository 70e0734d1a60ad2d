// Saved worlds on the page (issue 55; docs/WORLDS.md, PROTOCOL.md "save / open"):
// - Save: `save {session_id, title}` on the stream's socket; the answer `saved` gives the new
//   world's id, shown under the button (and the list is read again).
// - My worlds: GET /v1/worlds with the page's API key (`Authorization: Bearer`): each world's
//   title, chunks and last update, and three buttons: Open (the stored video plays from its
//   start, GET /v1/worlds/{id}/video, while `open` makes the world the socket's session; when
//   the stored video is nearly played the keys held continue it live), Download (the `.lwf`
//   export), Reopen (`reopen`: the world's inputs made again by the served model, from chunk 0,
//   for a world Open refuses as `world_changed`) and Delete.
// Titles and ids come from the server and are set as text (textContent), never as HTML.

import { encode } from "./msgpack.js";
import { codecFromInit } from "./player.js";
import { MODULE_SERVER } from "./server.js";

const FIRST_CHUNK_FRAMES = 9;
const CHUNK_FRAMES = 12;
const REPLY_TIMEOUT_MS = 60_000;
// error codes that answer a save or an open (PROTOCOL.md), as opposed to a chunk's
const WORLD_ERRORS = new Set(["bad_message", "world_not_found", "world_changed", "world_quota", "store_unavailable",
                              "too_large", "busy", "session_lost"]);

/** The URL of `path` under the server's /v1/worlds (route prefix kept). */
export function worldsUrl(server = MODULE_SERVER, path = "") {
  const base = new URL(server, globalThis.location ? globalThis.location.href : undefined);
  if (!base.pathname.endsWith("/")) base.pathname += "/";
  if (base.protocol === "ws:" || base.protocol === "wss:") base.protocol = base.protocol === "wss:" ? "https:" : "http:";
  return new URL(`v1/worlds${path}`, base).toString();
}

async function call(server, apiKey, method, path = "") {
  const response = await fetch(worldsUrl(server, path), {
    method, headers: apiKey ? { Authorization: `Bearer ${apiKey}` } : {} });
  if (!response.ok) {
    let body = null;
    try { body = await response.json(); } catch { /* not JSON: the status says it */ }
    throw Object.assign(new Error((body && body.message) || `HTTP ${response.status}`),
                        { code: (body && body.code) || "http" });
  }
  return response;
}

/** The caller's worlds, newest update first: [{id, title, chunks, bytes, updated, ...}]. */
export async function listWorlds(server, apiKey) {
  return (await (await call(server, apiKey, "GET")).json()).data;
}

/** Delete one of the caller's worlds. */
export async function deleteWorld(server, apiKey, id) {
  await call(server, apiKey, "DELETE", `/${encodeURIComponent(id)}`);
}

/** Download a world as one `.lwf` file (the browser saves `<id>.lwf`). */
export async function downloadWorld(server, apiKey, id) {
  const blob = await (await call(server, apiKey, "GET", `/${encodeURIComponent(id)}/export`)).blob();
  const a = document.createElement("a");
  a.href = URL.createObjectURL(blob);
  a.download = `${id}.lwf`;
  document.body.append(a);
  a.click();
  a.remove();
  setTimeout(() => URL.revokeObjectURL(a.href), 60_000);
}

/** The reply of a `save` / `open` / `reopen` just sent on the stream's socket: `type`, or its
 *  error; `onAnswer(msg)` runs as it is read, before the replies after it. */
function replyOf(stream, type, sessionId, onAnswer = () => {}) {
  return new Promise((resolve, reject) => {
    const done = () => { stream.intercept = null; clearTimeout(timer); };
    const timer = setTimeout(() => { done(); reject(Object.assign(new Error("the server did not answer"),
                                                                  { code: "connection" })); }, REPLY_TIMEOUT_MS);
    stream.intercept = (msg) => {
      if (msg.session_id !== sessionId) return false;
      if (msg.type === type) { done(); onAnswer(msg); resolve(msg); return true; }
      if (msg.type === "error" && WORLD_ERRORS.has(msg.code)) {
        done();
        reject(Object.assign(new Error(msg.message), { code: msg.code, world_id: msg.world_id, changed: msg.changed }));
        return true;
      }
      return false;
    };
  });
}

/** Save the session the stream plays as a world titled `title`: the `saved` answer. */
export async function saveWorld(stream, title) {
  if (stream.state !== "streaming" || !stream.sessionId || stream.ws === null) {
    throw Object.assign(new Error("no session is streaming"), { code: "client" });
  }
  const answer = replyOf(stream, "saved", stream.sessionId);
  stream.ws.send(encode({ endpoint: "save", session_id: stream.sessionId, title }));
  return answer;
}

/** Open a saved world in the stream: its stored video plays from the start and the session
 *  goes on from its last chunk with the keys held (`open`); the `opened` answer. */
export async function openWorld(stream, server, apiKey, id) {
  const video = new Uint8Array(await (await call(server, apiKey, "GET", `/${encodeURIComponent(id)}/video`))
    .arrayBuffer());
  if (stream.ws === null || stream.ws.readyState !== WebSocket.OPEN) await stream.connect(apiKey);
  if (["starting", "streaming", "resuming"].includes(stream.state)) stream.reset();
  const sessionId = `web-${Math.random().toString(36).slice(2, 10)}`;
  const answer = replyOf(stream, "opened", sessionId);
  stream.ws.send(encode({ endpoint: "open", session_id: sessionId, world_id: id }));
  const opened = await answer;
  const n = opened.next_chunk_id;
  stream.sessionId = sessionId;
  stream.options = null;
  stream.resumeToken = opened.resume_token || null;
  stream.queueToken = stream.queued = null;
  stream.keys.reset();
  stream.undoTo = null;
  stream.resetStats();
  const s = stream.stats;
  s.chunks = n; // the world's chunks are on screen: the next frame is chunk n
  s.frames = n === 0 ? 0 : FIRST_CHUNK_FRAMES + CHUNK_FRAMES * (n - 1);
  s.startedAt = s.sentAt = s.lastAt = performance.now();
  stream.nextChunk = n;
  await stream.player.open(`video/mp4; codecs="${codecFromInit(video) || "avc1.42E01E"}"`);
  stream.player.append(video);
  stream.setState("streaming");
  stream.status(`Opened a saved world of ${n} chunks: it plays from its start, then goes on with the keys held.`);
  stream.startTimer();
  return opened;
}

/** Run a saved world's inputs again through the served model as a new session (`reopen`: for a
 *  world `open` refuses as `world_changed`): its new chunks play from chunk 0, then the keys
 *  held continue it; the `reopened` answer. */
export async function reopenWorld(stream, apiKey, id) {
  if (stream.ws === null || stream.ws.readyState !== WebSocket.OPEN) await stream.connect(apiKey);
  if (["starting", "streaming", "resuming"].includes(stream.state)) stream.reset();
  const sessionId = `web-${Math.random().toString(36).slice(2, 10)}`;
  // the session's frames are the page's from now on (chunk 0 opens the player, as for Start)
  stream.sessionId = sessionId;
  stream.options = null;
  stream.resumeToken = null;
  stream.queueToken = stream.queued = null;
  stream.keys.reset();
  stream.undoTo = null;
  stream.player.close();
  stream.resetStats();
  stream.nextChunk = 0;
  stream.stats.inFlight = 1;
  stream.stats.startedAt = stream.stats.sentAt = performance.now();
  stream.setState("starting");
  const answer = replyOf(stream, "reopened", sessionId, (msg) => {
    stream.nextChunk = msg.chunks; // the server sends chunks 0 .. n-1 itself: the page asks for n on
    stream.stats.inFlight = msg.chunks;
    stream.intercept = (reply) => { // until chunk 0 came, a refusal stops the session (no Start to retry)
      if (reply.session_id !== sessionId) return false;
      if (reply.type === "frame") { stream.intercept = null; return false; }
      if (reply.type !== "error" || ["store_behind", "yielded"].includes(reply.code)) return false;
      stream.intercept = null;
      stream.fail(reply.code, reply.message);
      return true;
    };
  });
  stream.ws.send(encode({ endpoint: "reopen", session_id: sessionId, world_id: id }));
  let reopened;
  try {
    reopened = await answer;
  } catch (e) {
    stream.setState("stopped");
    throw e;
  }
  const changed = reopened.changed.length ? `the served model differs in ${reopened.changed.join(", ")}` : "same model";
  stream.status(`Reopened a saved world: its ${reopened.chunks} chunks made again (${changed}); new chunks, not the stored ones.`);
  stream.startTimer();
  return reopened;
}

/**
 * The page's Save button and "My worlds" list (index.html's #worlds-panel).
 * @param {LiveStream} stream the page's stream
 * @param {{apiKey: () => string, say: (text: string, level?: string) => void}} page
 */
export function bindWorlds(stream, page) {
  const $ = (id) => document.getElementById(id);
  const ui = { save: $("save"), title: $("save-title"), result: $("save-result"), list: $("worlds-list"),
               refresh: $("worlds-refresh"), note: $("worlds-note") };
  const server = stream.server;
  const note = (text, level = "info") => { ui.note.textContent = text; ui.note.dataset.level = level; };

  async function refresh() {
    let worlds;
    try {
      worlds = await listWorlds(server, page.apiKey());
    } catch (e) {
      ui.list.replaceChildren();
      note(e.code === "worlds_off" ? "This server keeps no worlds." : `Cannot list your worlds: ${e.message}`,
           e.code === "worlds_off" ? "info" : "warn");
      return;
    }
    note(worlds.length ? "" : "No saved world yet: Save keeps the session that plays.");
    ui.list.replaceChildren(...worlds.map(row));
  }

  function row(world) {
    const li = document.createElement("li");
    li.dataset.id = world.id;
    const title = document.createElement("span");
    title.className = "world-title";
    title.textContent = world.title || world.id;
    const meta = document.createElement("span");
    meta.className = "world-meta";
    meta.textContent = `${world.chunks} chunks · ${new Date(world.updated * 1000).toLocaleString()}`;
    const button = (label, action) => {
      const b = document.createElement("button");
      b.type = "button";
      b.textContent = label;
      b.dataset.action = label.toLowerCase();
      b.addEventListener("click", async () => {
        b.disabled = true;
        try { await action(); } catch (e) { page.say(`${label} failed (${e.code || "error"}): ${e.message}`, "error"); }
        b.disabled = false;
      });
      return b;
    };
    li.append(title, meta,
              button("Open", () => openWorld(stream, server, page.apiKey(), world.id)),
              button("Reopen", () => reopenWorld(stream, page.apiKey(), world.id)),
              button("Download", () => downloadWorld(server, page.apiKey(), world.id)),
              button("Delete", async () => { await deleteWorld(server, page.apiKey(), world.id); await refresh(); }));
    return li;
  }

  ui.save.addEventListener("click", async () => {
    ui.save.disabled = true;
    ui.result.textContent = "Saving…";
    try {
      const saved = await saveWorld(stream, ui.title.value.trim());
      ui.result.textContent = `Saved as world ${saved.world_id} (${saved.chunks} chunks).`;
      ui.result.dataset.worldId = saved.world_id;
      await refresh();
    } catch (e) {
      ui.result.textContent = `Not saved (${e.code || "error"}): ${e.message}`;
    }
    ui.save.disabled = stream.state !== "streaming";
  });
  ui.refresh.addEventListener("click", refresh);
  stream.addEventListener("state", (e) => {
    ui.save.disabled = e.detail.state !== "streaming";
    if (e.detail.state === "idle") refresh(); // connected: the list of this key's worlds
  });
  return { refresh };
}
