// The page: start-image picker, session form, keyboard/mouse/touch input, status on the video.
// The HUD, the progress and the figures are hud.js's; the sizes and the next steps after an
// error sizes.js's (both from the handshake); the touch pads touch.js's; Share share_panel.js's;
// the players panel (who watches, who plays: Grant, Revoke, Kick...) players_panel.js's.
// URL query parameters prefill the form: ?prompt=…&size=480*832&seed=7; an API key only from
// the fragment, #api_key=… (a fragment never reaches a server; stream.js sends the key as the
// socket's subprotocol, never in a URL). A viewer page's "Fork from here" opens this page at
// #fork=<world_id>&token=<watch_token>: it forks that world on boot and plays on (fork.js).

import { LiveStream } from "./stream.js";
import { bindKeyboard } from "./keyboard.js";
import { MsePlayer } from "./player.js";
import { SCENES, drawScene, canvasPng } from "./scenes.js";
import { showModel, showStats } from "./hud.js";
import { fillSizes, relabelSizes } from "./sizes.js";
import { bindPads, isTouch } from "./touch.js";
import { bindShare } from "./share_panel.js";
import { bindPlayers } from "./players_panel.js";
import { bindWorlds } from "./worlds.js";
import { forkOfFragment, forkWorld } from "./fork.js";

const $ = (id) => document.getElementById(id);
const UPLOAD = "upload";
const PASSTHROUGH_TYPES = new Set(["image/png", "image/jpeg"]);

const ui = {
  video: $("video"), viewport: $("viewport"), overlay: $("overlay"), status: $("status"),
  connection: $("connection"), form: $("setup"), scene: $("scene"), upload: $("upload"),
  preview: $("preview"), prompt: $("prompt"), steer: $("steer"), steerSend: $("steer-send"), size: $("size"), seed: $("seed"), apiKey: $("api-key"),
  start: $("start"), reset: $("reset"), undo: $("undo"), errors: $("errors"),
};
let uploaded = null; // {bytes, type} of the chosen file
let shownConfig = null; // the handshake the page shows

function setStatus(text, level = "info") {
  ui.status.textContent = text;
  ui.status.dataset.level = level;
  const showOnVideo = level !== "info" || stream.state !== "streaming";
  ui.overlay.textContent = showOnVideo ? text : "";
  ui.overlay.dataset.level = level;
  ui.status.classList.toggle("said-on-video", showOnVideo); // read once, on the video
}

function logError(code, message) {
  const li = document.createElement("li");
  li.textContent = `${new Date().toLocaleTimeString()} [${code}] ${message}`;
  li.dataset.code = code;
  ui.errors.prepend(li);
}

// ---- start image ----

for (const [value, label] of [...Object.entries(SCENES), [UPLOAD, "Upload an image…"]]) {
  ui.scene.add(new Option(label, value));
}

/** The start image's size: the Size list says what streams for it. */
const imageSize = () => ({ width: ui.preview.width, height: ui.preview.height });
const relabel = () => { if (shownConfig !== null) relabelSizes(ui.size, shownConfig, imageSize()); };

async function showUpload(file) {
  const bitmap = await createImageBitmap(file);
  ui.preview.width = bitmap.width;
  ui.preview.height = bitmap.height;
  ui.preview.getContext("2d").drawImage(bitmap, 0, 0);
  uploaded = { bytes: new Uint8Array(await file.arrayBuffer()), type: file.type };
}

ui.scene.addEventListener("change", () => {
  if (ui.scene.value === UPLOAD) ui.upload.click();
  else { uploaded = null; drawScene(ui.preview, ui.scene.value); relabel(); }
});
ui.upload.addEventListener("change", async () => {
  const file = ui.upload.files[0];
  if (!file) return;
  try {
    await showUpload(file);
    ui.scene.value = UPLOAD;
    relabel();
  } catch (e) {
    setStatus(`Cannot read that image: ${e.message}`, "error");
  }
});

/** PNG/JPEG bytes of the chosen start image (other formats are re-encoded as PNG). */
async function startImage() {
  if (uploaded !== null && PASSTHROUGH_TYPES.has(uploaded.type)) return uploaded.bytes;
  return canvasPng(ui.preview);
}

// ---- session ----

const stream = new LiveStream(ui.video);
stream.addEventListener("status", (e) => setStatus(e.detail.text, e.detail.level));
stream.addEventListener("stats", (e) => {
  showStats(e.detail);
  ui.undo.disabled = !e.detail.canUndo;
});
stream.addEventListener("error", (e) => logError(e.detail.code, e.detail.message));
stream.addEventListener("state", (e) => {
  const state = e.detail.state;
  ui.connection.textContent = state;
  ui.connection.dataset.state = state;
  ui.reset.disabled = !(state === "starting" || state === "streaming" || state === "resuming");
  // Start begins a new session: not while one runs (Reset ends it first).
  ui.start.disabled = state === "connecting" || state === "starting" || state === "streaming" || state === "resuming";
  ui.steerSend.disabled = state !== "streaming";
  if (state !== "streaming") ui.undo.disabled = true;
  if (state === "idle" && stream.config !== shownConfig) { // a handshake: what this server is and offers
    shownConfig = stream.config;
    showModel(shownConfig);
    fillSizes(ui.size, shownConfig, ui.size.value || new URLSearchParams(window.location.search).get("size"), imageSize());
  }
});

ui.form.addEventListener("submit", async (e) => {
  e.preventDefault();
  if (ui.start.disabled) return; // Enter in a field while a session runs
  const seed = ui.seed.value.trim();
  const size = ui.size.value.trim();
  try {
    const options = { image: await startImage(), prompt: ui.prompt.value,
                      seed: seed === "" ? undefined : Number(seed), size: size === "" ? undefined : size };
    await stream.start(options, ui.apiKey.value.trim());
    if (!isTouch()) ui.viewport.focus(); // keys go to the video; on a phone no keyboard pops up
  } catch (err) {
    setStatus(`Cannot start: ${err.message}`, "error");
    logError(err.code || "client", err.message);
  }
});
ui.reset.addEventListener("click", () => stream.reset());
bindShare(stream, { share: $("share"), audience: $("share-audience"), controls: $("share-controls"), panel: $("share-panel"), link: $("share-link"),
                   copy: $("share-copy"), unshare: $("unshare"), note: $("share-note") }, setStatus);
bindPlayers(stream, { panel: $("players-panel"), viewers: $("panel-viewers"), holder: $("panel-holder"),
                      director: $("panel-director"), pass: $("panel-pass"), passTo: $("pass-to"),
                      passButton: $("pass-controls"), list: $("panel-list") }, setStatus);
ui.undo.addEventListener("click", () => stream.undo());
// Prompt steering: the next chunk's infer carries prompt_update; the session keeps its scene.
const steer = () => {
  const text = ui.steer.value.trim();
  if (text && stream.steer(text)) setStatus(`Steering to: ${text}`, "info");
};
ui.steerSend.addEventListener("click", steer);
ui.steer.addEventListener("keydown", (e) => { if (e.key === "Enter") { e.preventDefault(); steer(); } });

// ---- input ----

bindKeyboard(stream.keys); // keyboard.js: the same keys drive a viewer's turn (viewer.js)

let dragging = null;
ui.viewport.addEventListener("pointerdown", (e) => {
  dragging = { x: e.clientX, y: e.clientY };
  ui.viewport.setPointerCapture(e.pointerId);
  ui.viewport.classList.add("dragging");
  ui.viewport.focus();
});
ui.viewport.addEventListener("pointermove", (e) => {
  if (dragging === null) return;
  stream.keys.drag(e.clientX - dragging.x, e.clientY - dragging.y);
  dragging = { x: e.clientX, y: e.clientY };
});
const endDrag = () => { dragging = null; ui.viewport.classList.remove("dragging"); };
ui.viewport.addEventListener("pointerup", endDrag);
ui.viewport.addEventListener("pointercancel", endDrag);
ui.video.addEventListener("click", () => { if (ui.video.paused) ui.video.play().catch(() => {}); });
bindPads($("pads"), stream.keys);
bindWorlds(stream, { apiKey: () => ui.apiKey.value.trim(), say: setStatus }); // Save, My worlds (worlds.js)
document.body.classList.toggle("touch", isTouch());
$("weights-link").addEventListener("click", (e) => {
  e.preventDefault();
  $("weights").open = true;
  $("weights").scrollIntoView({ behavior: "smooth", block: "start" });
});

// ---- boot ----

const params = new URLSearchParams(window.location.search);
for (const [param, input] of [["prompt", ui.prompt], ["seed", ui.seed]]) {
  if (params.has(param)) input.value = params.get(param);
}
const fragment = new URLSearchParams(window.location.hash.slice(1));
if (fragment.has("api_key")) ui.apiKey.value = fragment.get("api_key");
const fork = forkOfFragment(fragment); // "Fork from here" on a viewer page (fork.js)
if (fork !== null) history.replaceState(null, "", window.location.pathname + window.location.search); // read once
drawScene(ui.preview, ui.scene.value);
if (!MsePlayer.supported()) {
  ui.start.disabled = true;
  setStatus("This browser cannot play H.264 through Media Source Extensions; use a recent Chrome, Edge, Firefox or Safari.", "error");
} else {
  stream.connect(ui.apiKey.value.trim()).then(() => {
    if (fork === null) return;
    return forkWorld(stream, fork.worldId, fork.token).then(() => { if (!isTouch()) ui.viewport.focus(); }, (err) => {
      setStatus(`Cannot fork the shared world (${err.code || "client"}): ${err.message}. Press Start for a session of your own.`,
                err.code === "busy" ? "warn" : "error");
      logError(err.code || "client", err.message);
    });
  }, (err) => {
    setStatus(`${err.message}. Press Start to try again.`, "error");
    logError(err.code || "connection", err.message);
  });
}
