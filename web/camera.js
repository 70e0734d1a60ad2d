// Keyboard and mouse input -> the key state sent with `control` (PROTOCOL.md): the server
// integrates the keys held into each chunk's 12 poses (camera/keys.py), the page sends none.
//   move: W/S forward/back, A/D left/right, Q/E up/down; look: arrows or I/J/K/L, and mouse drag
//
// A key state changes -> one `control` at once (its event_id is the page's counter). A key
// tapped and released before the next chunk was requested stays held until that chunk's infer
// is sent, so a short tap still moves the camera. Drag to look: the pixels dragged since the
// last chunk become look keys for the next chunk (horizontal -> l / j, vertical -> k / i) once
// they pass DRAG_KEY_PX, then are released again (a drag is a turn rate: the key's per-frame
// step, `controls.yaw_deg` / `pitch_deg`, for every chunk the drag goes on).

export const CHUNK_FRAMES = 12;
const DRAG_KEY_PX = 6;

// Relative translations are divided by this (the `translation_scale` session option): a full
// speed step between latent frames (4 video frames of the server's default `controls.move`,
// 0.05) becomes 1, as in the reference's normalisation, and a still camera stays still.
export const TRANSLATION_SCALE = 4 * 0.05;

const KEY_OF_CODE = {
  KeyW: "w", KeyS: "s", KeyA: "a", KeyD: "d", KeyQ: "q", KeyE: "e",
  KeyI: "i", KeyJ: "j", KeyK: "k", KeyL: "l",
  ArrowUp: "arrowup", ArrowDown: "arrowdown", ArrowLeft: "arrowleft", ArrowRight: "arrowright",
};
export const CONTROL_CODES = new Set(Object.keys(KEY_OF_CODE));

export class KeyControl {
  /** `send(eventId, keys)` delivers one control (the page's socket); false when it could not. */
  constructor(send) {
    this.send = send;
    this.eventId = 0; // the last control sent
    this.sentAt = new Map(); // eventId -> performance.now() when sent, until a frame shows it
    this.reset();
  }

  /** A new session: nothing held, no drag, nothing sent yet. */
  reset() {
    this.held = new Set(); // key names down now
    this.fresh = new Set(); // pressed since the last infer was sent
    this.releasing = new Set(); // released before any infer used them: released after the next
    this.dragX = this.dragY = 0;
    this.dragKeys = new Set();
    this.lastSent = null; // the key state of the last control ("" joined), null: none this session
    this.sentAt.clear();
  }

  keyDown(code) {
    const key = KEY_OF_CODE[code];
    if (!key || this.held.has(key)) return;
    this.held.add(key);
    this.fresh.add(key);
    this.releasing.delete(key);
    this.flush();
  }

  keyUp(code) {
    const key = KEY_OF_CODE[code];
    if (!key || !this.held.has(key)) return;
    if (this.fresh.has(key)) { this.releasing.add(key); return; } // a tap: held for one chunk
    this.held.delete(key);
    this.flush();
  }

  releaseAll() {
    this.held.clear();
    this.fresh.clear();
    this.releasing.clear();
    this.flush();
  }

  drag(dx, dy) { this.dragX += dx; this.dragY += dy; }

  /** The keys held now (names, sorted): the keyboard's and the drag's. */
  keys() {
    return [...new Set([...this.held, ...this.dragKeys])].sort();
  }

  /** Send a control when the key state differs from the last one sent. */
  flush() {
    const keys = this.keys();
    const state = keys.join("+");
    if (state === this.lastSent) return;
    if (!this.send(this.eventId + 1, keys)) return; // no session to send it to: sent with the next chunk
    this.lastSent = state;
    this.eventId += 1;
    this.sentAt.set(this.eventId, performance.now());
  }

  /** Before a chunk's infer: the drag since the last chunk becomes its look keys. */
  beforeChunk() {
    this.dragKeys = new Set();
    if (this.dragX > DRAG_KEY_PX) this.dragKeys.add("l");
    if (this.dragX < -DRAG_KEY_PX) this.dragKeys.add("j");
    if (this.dragY > DRAG_KEY_PX) this.dragKeys.add("k"); // drag down: look down
    if (this.dragY < -DRAG_KEY_PX) this.dragKeys.add("i");
    this.dragX = this.dragY = 0;
    this.flush();
  }

  /** After a chunk's infer was sent: taps end, and the keys they held are released. */
  afterChunk() {
    this.fresh.clear();
    if (!this.releasing.size) return;
    for (const key of this.releasing) this.held.delete(key);
    this.releasing.clear();
    this.flush();
  }

  /** A frame showing key state `eventId` came at `now`: the lags of the controls it is the
   *  first to show (control sent -> this frame), in ms. */
  shown(eventId, now) {
    const lags = [];
    for (const [id, at] of this.sentAt) {
      if (id <= eventId) { lags.push(now - at); this.sentAt.delete(id); }
    }
    return lags;
  }
}
