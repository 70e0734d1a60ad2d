// The viewer page (watch.html, served at <server>/w/<world_id>): a world someone shares, live.
// The world id is the path's last part; the token comes from the URL's fragment,
// `#token=<watch_token>` (a fragment never reaches a server; watch.js sends the token in the
// socket's first message), and so does an API key, `#api_key=…` (or the key form, shown when
// the server asks for one). It shows how many watch, who drives (a `controls` notice: its
// `holder` and `players`), the owner reconnecting, the end. In a `turns` or `crowd` world,
// "Ask for the controls" makes this viewer a player; while it may drive, the keyboard drives
// (controls.js), and the chunks its keys made say "your input" (in `crowd`: the chunks whose
// `voters` name it: its held keys were among those the crowd pressed). "Fork from here" opens the main
// page on a session of one's own, forked from the world's head (fork.js).
//
// Everything the server says (names, prompts, reasons) reaches the page as text
// (`textContent`), never as HTML.

import { WorldWatch } from "./watch.js";
import { MsePlayer } from "./player.js";
import { WorldControls } from "./controls.js";
import { bindKeyboard } from "./keyboard.js";
import { forkLink } from "./fork.js";

const $ = (id) => document.getElementById(id);
const ui = {
  video: $("video"), overlay: $("overlay"), status: $("status"), connection: $("connection"), world: $("world"),
  viewers: $("viewers"), driver: $("driver"), players: $("players"), prompt: $("world-prompt"),
  chunks: $("stat-chunks"), skipped: $("stat-skipped"), keyForm: $("key-form"), apiKey: $("api-key"),
  ask: $("ask-controls"), fork: $("fork-here"), rewatch: $("rewatch"), role: $("role"), mine: $("your-input"),
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
  else if (msg.event === "kicked") setStatus("The world's owner removed you from it: you cannot watch it again.",
                                             "warn");
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

// ---- the controls (a `turns` or `crowd` world: controls.js) and "Fork from here" (fork.js) ----

const controls = new WorldControls(watch);
const ROLE_TEXT = { waiting: "waiting for a turn", driving: "you drive: WASD, Q/E, arrows/IJKL" };
controls.addEventListener("role", (e) => {
  const role = e.detail.role;
  ui.ask.hidden = role !== "watcher";
  ui.ask.disabled = false;
  ui.role.textContent = ROLE_TEXT[role] || "";
  ui.role.dataset.role = role;
  ui.role.hidden = !(role in ROLE_TEXT);
});
ui.ask.addEventListener("click", () => {
  if (controls.ask()) { ui.ask.disabled = true; ui.role.textContent = "asked for the controls…"; ui.role.hidden = false; }
});
watch.addEventListener("error", (e) => { // a refused ask or control (`forbidden`): said above, as text
  if (e.detail.code === "forbidden" && controls.role === "watcher") { ui.ask.disabled = false; ui.role.hidden = true; }
});
bindKeyboard(controls.keys, () => controls.driving); // keyboard.js: the main page's keys
watch.addEventListener("chunk", (e) => { // a chunk this viewer's keys made (its turn, or a crowd vote that counted)
  const mine = controls.made(e.detail);
  ui.mine.hidden = !mine;
  if (mine) ui.mine.dataset.chunks = String(Number(ui.mine.dataset.chunks || 0) + 1);
});
watch.addEventListener("state", (e) => { ui.fork.hidden = e.detail.state !== "watching"; });
// The main page forks the world and plays on as a session of its own (the link's fragment: fork.js).
ui.fork.addEventListener("click", () => window.location.assign(forkLink(window.location.href, worldId, token,
                                                                         ui.apiKey.value.trim())));

// ---- boot ----

if (!MsePlayer.supported()) {
  setStatus("This browser cannot play H.264 through Media Source Extensions; use a recent Chrome, Edge, Firefox or Safari.", "error");
} else {
  start();
}
