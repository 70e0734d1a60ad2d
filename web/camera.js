// Keyboard and mouse input -> per-chunk OpenCV camera-to-world poses (x right, y down, z forward).
//
// The world frame is the first camera's frame. Every chunk covers 12 video frames at 16 fps;
// `nextChunk()` integrates the input held (or tapped) since the previous chunk over those
// frames and returns one pose per frame (PROTOCOL: N = 12, pose i at local frame i).
//   move: W/S forward/back, A/D left/right, Q/E up/down (in the heading plane)
//   look: arrows or I/J/K/L, and mouse drag

export const CHUNK_FRAMES = 12;
const MOVE_PER_FRAME = 0.05; // scene units per frame at full speed
const TURN_PER_FRAME = (1.5 * Math.PI) / 180; // radians per frame (24 deg/s)
const DRAG_RAD_PER_PX = (0.25 * Math.PI) / 180;
const MAX_PITCH = (80 * Math.PI) / 180;

// Relative translations are divided by this (the `translation_scale` session option): a full
// speed step between latent frames (4 video frames) becomes 1, as in the reference's
// normalisation, and a still camera stays still.
export const TRANSLATION_SCALE = 4 * MOVE_PER_FRAME;

const KEYS = {
  forward: ["KeyW"], back: ["KeyS"], left: ["KeyA"], right: ["KeyD"], up: ["KeyQ"], down: ["KeyE"],
  lookLeft: ["ArrowLeft", "KeyJ"], lookRight: ["ArrowRight", "KeyL"],
  lookUp: ["ArrowUp", "KeyI"], lookDown: ["ArrowDown", "KeyK"],
};
export const CONTROL_CODES = new Set(Object.values(KEYS).flat());

/** Rotation yaw about y (positive: turn right), then pitch about x (positive: look up). */
function rotation(yaw, pitch) {
  const cy = Math.cos(yaw), sy = Math.sin(yaw), cp = Math.cos(pitch), sp = Math.sin(pitch);
  // Ry(yaw) @ Rx(pitch) with Ry = [[cy,0,sy],[0,1,0],[-sy,0,cy]], Rx = [[1,0,0],[0,cp,-sp],[0,sp,cp]]
  return [
    [cy, sy * sp, sy * cp],
    [0, cp, -sp],
    [-sy, cy * sp, cy * cp],
  ];
}

export class CameraRig {
  constructor() {
    this.held = new Set(); // key codes down now
    this.tapped = new Set(); // key codes pressed since the last chunk (a short tap still counts)
    this.dragX = 0; // pixels dragged since the last chunk
    this.dragY = 0;
    this.reset();
  }

  /** Back to the first camera (identity pose). */
  reset() {
    this.position = [0, 0, 0];
    this.yaw = 0;
    this.pitch = 0;
    this.tapped.clear();
    this.dragX = this.dragY = 0;
  }

  keyDown(code) { this.held.add(code); this.tapped.add(code); }
  keyUp(code) { this.held.delete(code); }
  releaseAll() { this.held.clear(); }
  drag(dx, dy) { this.dragX += dx; this.dragY += dy; }

  active(name) {
    return KEYS[name].some((c) => this.held.has(c) || this.tapped.has(c));
  }

  axis(plus, minus) { return (this.active(plus) ? 1 : 0) - (this.active(minus) ? 1 : 0); }

  /** Poses of the next chunk: [12][4][4] camera-to-world, one per video frame. */
  nextChunk(frames = CHUNK_FRAMES) {
    const fwd = this.axis("forward", "back"), side = this.axis("right", "left"), lift = this.axis("up", "down");
    const turn = this.axis("lookRight", "lookLeft") * TURN_PER_FRAME + (this.dragX * DRAG_RAD_PER_PX) / frames;
    const tilt = this.axis("lookUp", "lookDown") * TURN_PER_FRAME - (this.dragY * DRAG_RAD_PER_PX) / frames;
    this.tapped.clear();
    this.dragX = this.dragY = 0;
    const poses = [];
    for (let i = 0; i < frames; i++) {
      if (i > 0) this.step(fwd, side, lift, turn, tilt);
      poses.push(this.pose());
    }
    this.step(fwd, side, lift, turn, tilt); // the next chunk starts one frame on
    return poses;
  }

  step(fwd, side, lift, turn, tilt) {
    const sy = Math.sin(this.yaw), cy = Math.cos(this.yaw);
    // heading-plane axes: forward (sy, 0, cy), right (cy, 0, -sy), up (0, -1, 0)
    this.position[0] += MOVE_PER_FRAME * (fwd * sy + side * cy);
    this.position[1] -= MOVE_PER_FRAME * lift;
    this.position[2] += MOVE_PER_FRAME * (fwd * cy - side * sy);
    this.yaw += turn;
    this.pitch = Math.max(-MAX_PITCH, Math.min(MAX_PITCH, this.pitch + tilt));
  }

  /** The current camera-to-world matrix as nested lists. */
  pose() {
    const r = rotation(this.yaw, this.pitch);
    const t = this.position;
    return [[...r[0], t[0]], [...r[1], t[1]], [...r[2], t[2]], [0, 0, 0, 1]];
  }
}

/** Intrinsics rows (fx, fy, cx, cy) for a frame of [h, w] pixels: focal 500 px at 832 wide. */
export function intrinsicsRows([h, w], n = CHUNK_FRAMES) {
  const f = (500 * w) / 832;
  return Array.from({ length: n }, () => [f, f, w / 2, h / 2]);
}
