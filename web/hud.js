// What the page says about the stream: the overlay on the video (HUD: frames/s generated, chunk
// interval, control lag, the chunk being made and the video buffered), the progress from Start to the first frame,
// the control-lag hint under the video, and the detailed figures in the collapsible panel.
//
// Three frame rates, each named where it shows (the key in Details says which is which):
// generated, the last chunk's frames over the time from its request to its reply (HUD, Details);
// arriving, the same over the last 4 chunks (what playback follows, playback.js); playing, the
// rate the video plays at (16 fps x the playback rate).
//
// Chunks from the server's prefix store (`cached`: an earlier session with the same inputs made
// them) are said to be replays, never shown as a speed.

const $ = (id) => document.getElementById(id);
const ms = (s) => (s === null || s === undefined ? "–" : `${Math.round(s * 1000)} ms`);
const secs = (s) => (s < 10 ? s.toFixed(1) : Math.round(s).toString());
const TYPICAL_FIRST_CHUNK_S = 5; // the progress bar's scale before this page measured one
let lastTtfc = null; // the last session's time to first chunk on this page

/** The HUD and the panel from one "stats" event of LiveStream. */
export function showStats(s) {
  $("hud").hidden = s.chunks === 0;
  $("hud-fps").textContent = s.lastCached ? "replay from the prefix store"
    : s.fps === null ? "– fps generated" : `${s.fps.toFixed(1)} fps generated`;
  $("hud-fps").dataset.replay = String(s.lastCached);
  $("hud-interval").textContent = s.lastInterval === null ? "chunk every –" : `chunk every ${secs(s.lastInterval)} s`;
  $("hud-lag").textContent = s.controlLag === null ? "control lag –" : `control lag ${secs(s.controlLag)} s`;
  $("hud-lag").dataset.measured = String(s.controlLag !== null);
  const buffered = `${s.bufferedS.toFixed(1)} s buffered`; // video received, not played yet
  $("hud-work").textContent = s.generating !== null ? `generating chunk ${s.generating} · ${buffered}` : buffered;
  $("lag-hint").textContent = s.controlLagP50 === null ? (s.chunks ? "Press a key: the page measures when it shows." : "")
    : `A key shows in about ${secs(s.controlLagP50)} s here.`;
  showProgress(s);
  showDetails(s);
}

/** Start -> first frame: a bar scaled by the last session's time to first chunk. */
function showProgress(s) {
  const waiting = s.state === "starting" && s.chunks === 0 && s.startedAt !== undefined;
  $("progress").hidden = !waiting;
  if (s.ttfc !== null) lastTtfc = s.ttfc;
  if (!waiting) return;
  const elapsed = (performance.now() - s.startedAt) / 1000;
  const expected = lastTtfc || TYPICAL_FIRST_CHUNK_S;
  $("progress-fill").style.width = `${Math.round(100 * Math.min(0.95, 1 - Math.exp(-elapsed / expected)))}%`;
  $("progress-text").textContent = `Making the first chunk (text, image, 3 latent frames, decode): ${secs(elapsed)} s`
    + (lastTtfc ? `, about ${secs(lastTtfc)} s last time` : "");
}

function showDetails(s) {
  $("stat-ttfc").textContent = ms(s.ttfc);
  $("stat-interval").textContent = s.lastInterval === null ? "–"
    : `${ms(s.lastInterval)} (p50 ${ms(s.p50)}, p95 ${ms(s.p95)}; realtime ≤ 750 ms)`;
  $("stat-queue").textContent = `${s.inFlight} in flight, ${s.bufferedS.toFixed(2)} s of video buffered`;
  const chunks = $("stat-chunks");
  chunks.textContent = `${s.chunks} / ${s.frames}` + (s.cached ? ` (${s.cached} from the server's prefix store)` : "");
  chunks.dataset.cached = String(s.cached);
  chunks.dataset.chunks = String(s.chunks);
  $("stat-fps").textContent = s.lastCached ? "replayed from the server's prefix store (no generation)"
    : s.fps === null ? "–" : `${s.fps.toFixed(1)} fps generated (last chunk; realtime is 16)`;
  $("stat-lag").textContent = s.controlLag === null ? "–"
    : `${ms(s.controlLag)} (p50 ${ms(s.controlLagP50)}; key state ${s.eventId})`;
  const rate = $("stat-playback");
  rate.textContent = s.playback;
  rate.dataset.rate = String(s.playbackRate);
  $("stat-stages").textContent = s.stages === null ? "–"
    : s.lastCached ? "from the server's prefix store (an earlier session with the same inputs made it)"
    : Object.entries(s.stages).map(([k, v]) => `${k} ${ms(v)}`).join(", ");
}

/** The model line and the random-weights notice, from the handshake. */
export function showModel(config) {
  const random = config.random_weights === true;
  $("notice").hidden = !random;
  $("model").textContent = random ? `${config.model} · random weights`
    : `${config.model}${config.checkpoint ? ` · ${config.checkpoint}` : ""}`;
  $("weights-what").textContent = random ? `the ${config.model} model with seeded random weights`
    : `${config.model}${config.checkpoint ? ` from ${config.checkpoint}` : ""}`;
}
