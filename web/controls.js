// A viewer's part in a shared world's driving (PROTOCOL.md "Players"): in a `turns` or `crowd`
// world it may `ask_controls` (it becomes a player: in `turns` waiting for a turn, in `crowd` a
// voter at once); while it may drive (`turns`: it holds the controls; `crowd`: it is a player)
// its key states go on the watch socket as `control`s naming the world's id, with the event ids
// of a KeyControl (camera.js: increasing; a tap held for one chunk, here until the next chunk
// arrives). The roles come from `watching` and the `world` notices `controls`; `kicked` ends them.
// `made(chunk)`: this viewer's input made the chunk (its turn's, or a crowd chunk's voter).

import { KeyControl } from "./camera.js";

const ASKABLE = new Set(["turns", "crowd"]);

/**
 * The roles of this viewer in the world a WorldWatch shows.
 *
 * Events (CustomEvent): "role" {role, controls, holder, players}: role one of "watcher" (may
 * ask), "waiting" (a player waiting for a turn), "driving" (its keys drive), "none" (the
 * world's controls are the owner's, or it ended).
 */
export class WorldControls extends EventTarget {
  /** @param {import("./watch.js").WorldWatch} watch */
  constructor(watch) {
    super();
    this.watch = watch;
    this.keys = new KeyControl((eventId, keys) => this.sendControl(eventId, keys));
    this.roles({});
    watch.addEventListener("watching", (e) => { this.keys.reset(); this.roles(e.detail); });
    watch.addEventListener("world", (e) => {
      if (e.detail.event === "controls") this.roles({ ...e.detail, controls: this.controls, viewer_id: this.viewerId });
      else if (e.detail.event === "kicked" || e.detail.event === "ended") this.roles({});
    });
    watch.addEventListener("state", (e) => { if (e.detail.state !== "watching") this.roles({}); });
    watch.addEventListener("chunk", () => { this.keys.beforeChunk(); this.keys.afterChunk(); }); // taps end
  }

  /** Take the roles of a `watching` answer or a `controls` notice (`{}`: none any more). */
  roles(msg) {
    const was = this.role;
    this.viewerId = msg.viewer_id ?? null;
    this.controls = msg.controls ?? null;
    this.holder = msg.holder ?? null;
    this.players = Array.isArray(msg.players) ? msg.players : [];
    const player = this.viewerId !== null && this.players.includes(this.viewerId);
    if (!ASKABLE.has(this.controls) || this.viewerId === null) this.role = "none";
    else if (this.controls === "crowd") this.role = player ? "driving" : "watcher";
    else if (this.holder === this.viewerId) this.role = "driving";
    else this.role = player ? "waiting" : "watcher";
    if (this.role === was) return;
    if (this.role === "driving") this.keys.flush(); // the keys held now, at once
    else this.keys.releaseAll(); // nothing held comes back with a later turn
    this.dispatchEvent(new CustomEvent("role", { detail: { role: this.role, controls: this.controls,
                                                           holder: this.holder, players: this.players } }));
  }

  /** A chunk (watch.js "chunk" detail) this viewer's input made: its own turn's (`player` is its
   *  viewer_id), or a `crowd` chunk whose `voters` name it (its keys were among those pressed). */
  made(chunk) {
    if (this.viewerId === null) return false;
    return chunk.player === this.viewerId || (chunk.player === "crowd" && (chunk.voters || []).includes(this.viewerId));
  }

  /** This viewer's keys drive now. */
  get driving() { return this.role === "driving"; }

  /** Send `ask_controls`; false when this viewer cannot ask (not watching, an `owner` world, a player already). */
  ask() {
    if (this.role !== "watcher") return false;
    return this.watch.send({ endpoint: "ask_controls", session_id: this.watch.worldId });
  }

  sendControl(eventId, keys) {
    if (!this.driving) return false;
    return this.watch.send({ endpoint: "control", session_id: this.watch.worldId, event_id: eventId, keys });
  }
}
