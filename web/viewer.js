// The viewer page (watch.html, served at <server>/w/<world_id>): a world someone shares, live.
// The world id is the path's last part; the token comes from the URL's fragment,
// `#token=<watch_token>` (a fragment never reaches a server; watch.js sends the token in the
// socket's first message), and so does an API key, `#api_key=…` (or the key form, shown when
// the server asks for one). It shows how many watch, who drives (a `controls` notice: its
// `holder` and `players`), the owner reconnecting, the end.
//
// Everything the server says (names, prompts, reasons) reaches the page as text
// (`textContent`), never as HTML.

import { WorldWatch } from "./watch.js";
import { MsePlayer } from "./player.js";

const $ = (id) => document.getElementById(id);
const ui = {
  video: $("video"), overlay: $("overlay"), status: $("status"), connection: $("connection"), world: $("world"),
  viewers: $("viewers"), driver: $("driver"), players: $("players"), prompt: $("world-prompt"),
  chunks: $("stat-chunks"), skipped: $("stat-skipped"), keyForm: $("key-form"), apiKey: $("api-key"),
  ask: $("ask-controls"), fork: $("fork-here"), rewatch: $("rewatch"),
};

const worldId = window.location.pathname.replace(/\/+$/, "").split("/").pop() || ""; // url-safe characters
const fragment = new URLSearchParams(window.location.hash.slice(1));
const token = fragment.get("token") || "";
ui.apiKey.value = fragment.get("api_key") || "";
const watch = new WorldWatch(ui.video);

function setStatus(text, level = "info") {
  ui.status.textContent = text;
  ui.status.dataset.level = level;
  ui.overlay.textContent = level === "info" && watch.chunks > 0 ? "" : text; // on the video until it plays
  ui.overlay.dataset.level = level;
}

/** A person as the server names them: a string, or a map with `name` (or `id`). */
const who = (p) => (p !== null && typeof p === "object" ? String(p.name ?? p.id ?? "") : String(p ?? ""));

function showViewers(n) {
  if (typeof n !== "number") return;
  ui.viewers.textContent = `${n} watching`;
  ui.viewers.dataset.count = String(n);
}

/** A `controls` notice (shared worlds with players): who holds the controls, who plays. */
function showControls(msg) {
  const holder = who(msg.holder);
  ui.driver.textContent = holder ? `driven by ${holder}` : "nobody drives";
  const players = Array.isArray(msg.players) ? msg.players.map(who).filter(Boolean) : [];
  ui.players.textContent = players.length ? `Players: ${players.join(", ")}` : "";
  ui.players.hidden = players.length === 0;
}

watch.addEventListener("state", (e) => {
  ui.connection.textContent = e.detail.state;
  ui.connection.dataset.state = e.detail.state;
  ui.rewatch.hidden = e.detail.state !== "disconnected" || token === "";
});
watch.addEventListener("watching", (e) => {
  const w = e.detail;
  ui.world.textContent = `world ${w.world_id}`;
  showViewers(w.viewers);
  ui.keyForm.hidden = true;
  setStatus(w.next_chunk_id === undefined ? "Watching: the world's first chunk is on its way…"
    : "Watching: the video starts at the world's current chunk…");
});
watch.addEventListener("chunk", (e) => {
  const d = e.detail;
  ui.chunks.textContent = `${d.chunks} / ${d.frames}`;
  ui.chunks.dataset.chunks = String(d.chunks);
  ui.skipped.textContent = String(d.skipped);
  if (d.chunks === 1) setStatus(`Watching live (${d.resolution[0]}×${d.resolution[1]}).`);
});
watch.addEventListener("world", (e) => {
  const msg = e.detail;
  showViewers(msg.viewers);
  if (typeof msg.prompt === "string") { // a share that shows its prompt
    ui.prompt.textContent = `Prompt: ${msg.prompt}`;
    ui.prompt.hidden = false;
  }
  if (msg.event === "controls") showControls(msg);
  else if (msg.event === "owner_reconnecting") setStatus("The owner's connection dropped: waiting for them to come back…", "warn");
  else if (msg.event === "owner_back") setStatus("The owner is back: watching live.");
  else if (msg.event === "ended") setStatus(`The world ended${msg.reason ? `: ${msg.reason}` : ""}.`, "warn");
});
watch.addEventListener("error", (e) => {
  const { code, message } = e.detail;
  if (code === "connection" && watch.state !== "ended") setStatus(`Connection lost (${message}).`, "error");
  else if (code !== "connection") setStatus(`Error (${code}): ${message}`, "error");
});

async function start() {
  if (!worldId || !token) {
    setStatus("This link has no world or no token: ask the world's owner for its Share link "
              + "(…/w/<world>#token=…).", "error");
    return;
  }
  setStatus("Opening the world…");
  try {
    await watch.watch(worldId, token, ui.apiKey.value.trim());
  } catch (err) {
    if (err.code === "unauthorized") {
      ui.keyForm.hidden = false;
      setStatus(`Not allowed to watch: ${err.message}. The link may have been revoked, or this server needs `
                + "your API key.", "error");
    } else if (err.code === "busy") {
      setStatus(`The world is full or busy: ${err.message}. Try again in ${err.retryAfterS || 5} s.`, "warn");
    } else {
      setStatus(`Cannot watch: ${err.message}.`, "error");
    }
  }
}

ui.keyForm.addEventListener("submit", (e) => { e.preventDefault(); start(); });
ui.rewatch.addEventListener("click", () => start());
ui.video.addEventListener("click", () => { if (ui.video.paused) ui.video.play().catch(() => {}); });

// ---- for the lead to wire (issue 56 items 4 and 5: the server messages are being added) ----
// "Ask for the controls" (a world with `controls: turns`: ask its holder) and "Fork from here"
// (`fork` with the watch token: a session of one's own from the world's head). Each stays
// hidden while its request is null; set it to a function that sends the request on `watch`
// (WorldWatch.send) and shows the answer (a `world` notice reaches the handler above).
const ASK_FOR_CONTROLS = null; // (watch) => watch.send({ endpoint: ..., ... })
const FORK_FROM_HERE = null; // (watch, token) => ... then open the main page on the new session
ui.ask.hidden = ASK_FOR_CONTROLS === null;
ui.fork.hidden = FORK_FROM_HERE === null;
if (ASK_FOR_CONTROLS !== null) ui.ask.addEventListener("click", () => ASK_FOR_CONTROLS(watch));
if (FORK_FROM_HERE !== null) ui.fork.addEventListener("click", () => FORK_FROM_HERE(watch, token));

// ---- boot ----

if (!MsePlayer.supported()) {
  setStatus("This browser cannot play H.264 through Media Source Extensions; use a recent Chrome, Edge, Firefox or Safari.", "error");
} else {
  start();
}
