// Playback rate while generation is slower than real time: play what has arrived at the rate it
// arrives, instead of playing at 16 fps until the buffer runs dry (a freeze, then a jump).
//
// The arrival rate is the frames of the last ARRIVAL_CHUNKS chunks over the time they took to
// come; the target rate is that over 16 fps (at most 1). The buffer steers around it: with less
// than one chunk of video buffered the rate goes down in proportion (down to half the target),
// with more it goes up (up to 1.5 times the target, never above 1), so the buffer neither
// drains nor grows. The page shows the rate (`describe`).

const FPS = 16;
const ARRIVAL_CHUNKS = 4;
const MIN_RATE = 0.0625; // the lowest playbackRate browsers honour for video
export const TARGET_BUFFER_S = 12 / FPS; // one chunk

export class RatePacer {
  constructor() { this.reset(); }

  reset() {
    this.arrivals = []; // [performance.now() ms, frames] of the last chunks
    this.rate = 1;
  }

  /** A chunk of `frames` frames arrived at `now` (ms). */
  arrived(frames, now) {
    this.arrivals.push([now, frames]);
    if (this.arrivals.length > ARRIVAL_CHUNKS + 1) this.arrivals.shift();
  }

  /** Frames per second arriving (null until two chunks came). */
  arrivalFps() {
    const a = this.arrivals;
    if (a.length < 2) return null;
    const frames = a.slice(1).reduce((sum, [, f]) => sum + f, 0);
    return frames / Math.max((a[a.length - 1][0] - a[0][0]) / 1000, 1e-3);
  }

  /** The playback rate for `bufferedS` seconds of video ahead of the playhead. */
  update(bufferedS) {
    const fps = this.arrivalFps();
    if (fps === null) { this.rate = 1; return this.rate; }
    const target = Math.min(1, fps / FPS);
    const steer = Math.min(1.5, Math.max(0.5, bufferedS / TARGET_BUFFER_S));
    this.rate = Math.max(MIN_RATE, Math.min(1, target * steer));
    return this.rate;
  }

  describe() {
    const fps = this.arrivalFps();
    if (fps === null) return "–";
    const played = this.rate * FPS;
    return `${this.rate.toFixed(2)}× (playing ${played.toFixed(1)} fps; chunks arrive at ${fps.toFixed(1)} fps)`;
  }
}
