// Playback rate while generation is slower than real time: play what has arrived at the rate it
// arrives, instead of playing at 16 fps until the buffer runs dry (a freeze, then a jump).
//
// The generation rate is measured per chunk as its frames over its latency (request sent ->
// frame reply), averaged over the last RATE_CHUNKS chunks: with one request in flight that is
// the rate chunks can arrive at, whatever the page's own pacing (a rate taken from the arrival
// times would follow the playback it steers). At 16 fps or more the video plays at 1×. Below,
// the target rate is that over 16 fps, and the buffer steers around it: with less than one
// chunk of video buffered the rate goes down in proportion (down to half the target), with
// more it goes up (up to 1.5 times the target, never above 1), so the buffer neither drains
// nor grows. The page shows the rate (`describe`).

const FPS = 16;
const RATE_CHUNKS = 4;
const MIN_RATE = 0.0625; // the lowest playbackRate browsers honour for video
export const TARGET_BUFFER_S = 12 / FPS; // one chunk

export class RatePacer {
  constructor() { this.reset(); }

  reset() {
    this.chunks = []; // [frames, latency s] of the last chunks
    this.rate = 1;
  }

  /** A chunk of `frames` frames arrived `latencyS` seconds after its request was sent. */
  arrived(frames, latencyS) {
    this.chunks.push([frames, Math.max(latencyS, 1e-3)]);
    if (this.chunks.length > RATE_CHUNKS) this.chunks.shift();
  }

  /** Frames per second the server delivers (null before the first chunk after the first:
   *  the first carries the session's start-up). */
  generationFps() {
    const c = this.chunks;
    if (!c.length) return null;
    return c.reduce((sum, [f]) => sum + f, 0) / c.reduce((sum, [, s]) => sum + s, 0);
  }

  /** The playback rate for `bufferedS` seconds of video ahead of the playhead. */
  update(bufferedS) {
    const fps = this.generationFps();
    if (fps === null || fps >= FPS) { this.rate = 1; return this.rate; }
    const steer = Math.min(1.5, Math.max(0.5, bufferedS / TARGET_BUFFER_S));
    this.rate = Math.max(MIN_RATE, Math.min(1, (fps / FPS) * steer));
    return this.rate;
  }

  describe() {
    const fps = this.generationFps();
    if (fps === null) return "–";
    return `${this.rate.toFixed(2)}× (playing ${(this.rate * FPS).toFixed(1)} fps; arriving ${fps.toFixed(1)} fps)`;
  }
}
