// The owner's players panel on the demo page (index.html, inside the Share panel): while the
// session is shared, who watches and who plays, from the world's `players` (PROTOCOL.md
// "Players": the page shares with `notify_players`, so the server sends one unasked whenever
// the world's viewers or roles change, and one answers each request below; the one with the
// largest `version` is shown). It shows how many watch, who holds the controls (`turns`; the
// crowd in `crowd`), the director, and one row per viewer (its `viewer_id`; the players
// marked) with:
//   Grant          a viewer that is no player: `grant` (a player: it votes in `crowd`); in
//                  `turns` any viewer not holding the controls: `grant` if needed, then
//                  `pass_controls` to it (it drives now)
//   Make director  `grant` with `director: true` (its `prompt` steers the world)
//   Revoke         a player: `revoke` (it still watches)
//   Kick           `kick` (its watch ends; its key cannot watch this world again)
// and, in `turns`, "Pass the controls" to a player picked (or back to the owner). The unasked
// `players` come on the socket that shared (or shared again): after a resume on a new socket the
// page shares again (the same world and token), so they follow it there.
// Viewer ids reach the page as text (`textContent`), never as HTML.

const ROLE_TEXT = { holder: "drives", director: "director", player: "player", viewer: "watching" };

/**
 * @param {import("./stream.js").LiveStream} stream
 * @param {{panel, viewers, holder, director, pass, passTo, passButton, list}} ui the elements (index.html)
 * @param {(text: string, level?: string) => void} say the page's status line
 */
export function bindPlayers(stream, ui, say) {
  let shown = null; // the `players` shown (the newest by `version`)

  const ask = async (endpoint, fields, done) => {
    try {
      await stream.shares.players(endpoint, fields);
      if (done) say(done);
    } catch (err) {
      say(`Cannot ${endpoint.replace("_", " ")} (${err.code}): ${err.message}`, "warn");
    }
  };

  const button = (text, act, onClick) => {
    const b = document.createElement("button");
    b.type = "button";
    b.textContent = text;
    b.dataset.act = act;
    b.addEventListener("click", onClick);
    return b;
  };

  const row = (id, p) => {
    const player = p.players.includes(id);
    const role = p.holder === id ? "holder" : p.director === id ? "director" : player ? "player" : "viewer";
    const li = document.createElement("li");
    li.dataset.viewer = id;
    li.dataset.role = role;
    const who = document.createElement("span");
    who.className = "who";
    who.textContent = id;
    const what = document.createElement("span");
    what.className = "role";
    what.textContent = ROLE_TEXT[role];
    li.append(who, " ", what);
    const turns = p.controls === "turns";
    if (turns ? p.holder !== id : !player) {
      li.append(button("Grant", "grant", async () => {
        if (!player) await ask("grant", { viewer_id: id }, turns ? null : `${id} plays now.`);
        if (turns) await ask("pass_controls", { viewer_id: id }, `${id} holds the controls now.`);
      }));
    }
    if (p.director !== id) {
      li.append(button("Make director", "director", () => ask("grant", { viewer_id: id, director: true },
                                                             `${id} steers the prompt now.`)));
    }
    if (player) {
      li.append(button("Revoke", "revoke", () => ask("revoke", { viewer_id: id }, `${id} only watches now.`)));
    }
    li.append(button("Kick", "kick", () => ask("kick", { viewer_id: id }, `${id} was removed from the world.`)));
    return li;
  };

  const show = (p) => {
    shown = p;
    ui.panel.hidden = p === null;
    if (p === null) { ui.list.replaceChildren(); return; }
    const n = typeof p.viewers === "number" ? p.viewers : p.viewer_ids.length;
    ui.viewers.textContent = n === 1 ? "1 watching" : `${n} watching`;
    ui.viewers.dataset.count = String(n);
    ui.holder.textContent = p.controls === "crowd" ? "the crowd drives"
      : p.holder && p.holder !== "owner" ? `${p.holder} drives` : "you drive";
    ui.holder.dataset.holder = p.holder ?? "";
    ui.director.textContent = p.director ? `director: ${p.director}` : "";
    ui.pass.hidden = p.controls !== "turns";
    const mine = new Option("me (the owner)", "");
    ui.passTo.replaceChildren(mine, ...p.players.map((id) => new Option(id, id))); // Option: text, never HTML
    ui.list.replaceChildren(...p.viewer_ids.map((id) => row(id, p)));
  };

  stream.shares.onPlayers = (p) => {
    if (!Array.isArray(p.viewer_ids) || !Array.isArray(p.players)) return;
    if (shown !== null && shown.world_id === p.world_id && typeof p.version === "number"
        && typeof shown.version === "number" && p.version < shown.version) return; // a newer notice passed it
    if (stream.shares.shared !== null && p.world_id !== stream.shares.shared.world_id) return; // an older world's
    show(p);
  };
  ui.passButton.addEventListener("click", () => {
    const to = ui.passTo.value;
    ask("pass_controls", to ? { viewer_id: to } : {},
        to ? `${to} holds the controls now.` : "You hold the controls again.");
  });
  let was = stream.state;
  stream.addEventListener("state", (e) => {
    const state = e.detail.state;
    if (state !== "streaming" && state !== "resuming") show(null);
    const shared = stream.shares.shared;
    if (was === "resuming" && state === "streaming" && shared !== null) { // resumed on a new socket: `players`
      stream.shares.share({ audience: shared.audience, controls: shared.controls }) // come there once it asks
        .catch((err) => say(`The players panel stopped following the world (${err.code}): ${err.message}`, "warn"));
    }
    was = state;
  });
  return { show, get shown() { return shown; } };
}
