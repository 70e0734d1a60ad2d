// The demo page's Share button (index.html): while a session streams, Share sends `share` with
// the audience chosen beside it (`link`: anyone holding the link; `principal`: only this API
// key, or this address without auth) and who drives (`owner`; `turns`: a viewer who asks gets
// the controls when passed them; `crowd`: the players' keys are merged), shows the viewer page's link
// `<server>/w/<world_id>#token=<watch_token>` (share.js) and copies it; Unshare revokes it. The
// world ends with the session (Reset, Start, a failure), and the link is taken off the page then.

import { shareLink } from "./share.js";

const LIVE = new Set(["streaming", "resuming"]); // a share made stays across a resume

/**
 * @param {import("./stream.js").LiveStream} stream
 * @param {{share, audience, controls, panel, link, copy, unshare, note}} ui the elements (index.html)
 * @param {(text: string, level?: string) => void} say the page's status line
 */
export function bindShare(stream, ui, say) {
  const show = (shared) => {
    ui.panel.hidden = shared === null;
    ui.link.value = shared === null ? "" : shareLink(stream.server, shared.world_id, shared.watch_token);
    ui.audience.disabled = ui.controls.disabled = shared !== null; // a shared session answers the same world again
    ui.share.textContent = shared === null ? "Share" : "Copy link";
  };

  const copy = async () => {
    ui.link.select();
    try {
      await navigator.clipboard.writeText(ui.link.value);
      ui.note.textContent = "Link copied: whoever opens it watches this world live.";
    } catch {
      ui.note.textContent = "Select the link and copy it: whoever opens it watches this world live.";
    }
  };

  ui.share.addEventListener("click", async () => {
    if (stream.shares.shared !== null) { copy(); return; }
    ui.share.disabled = true;
    try {
      const shared = await stream.shares.share({ audience: ui.audience.value, controls: ui.controls.value });
      show(shared);
      copy();
      say(shared.audience === "principal" ? "Shared with your own API key only: open the link where you use it."
        : "Shared: anyone with the link watches this world live.");
    } catch (err) {
      say(`Cannot share (${err.code}): ${err.message}`, "warn");
    } finally {
      ui.share.disabled = stream.state !== "streaming";
    }
  });
  ui.copy.addEventListener("click", copy);
  ui.unshare.addEventListener("click", async () => {
    try {
      await stream.shares.unshare();
      show(null);
      ui.note.textContent = "";
      say("Unshared: the link opens nothing any more; its viewers were told the world ended.");
    } catch (err) {
      say(`Cannot unshare (${err.code}): ${err.message}`, "warn");
    }
  });
  stream.addEventListener("state", (e) => {
    const state = e.detail.state;
    ui.share.disabled = state !== "streaming";
    if (!LIVE.has(state) && !ui.panel.hidden) { // the world ended with the session
      stream.shares.forget();
      show(null);
      ui.note.textContent = "";
    }
  });
}
