// Plays a session's fMP4 chunks through Media Source Extensions as they arrive.
// Chunk 0 starts with the init segment (ftyp + moov); every chunk is moof + mdat with its own
// decode time (tfdt), so the SourceBuffer runs in 'segments' mode. A new session (timestamps
// from 0 again) gets a fresh MediaSource. `dropFrom(t)` takes the video from t on out of the
// buffer (an undone chunk): the chunk that replaces it has the same timestamps.
// A viewer of a shared world opens it with `{ sequence: true }` ('sequence' mode): each chunk
// plays right after the one before whatever its timestamps, the first one at 0, so a late join
// (its first chunk not at 0), a skipped chunk or the owner's Undo (timestamps back) plays on
// without a gap. A playhead before the first video buffered jumps to it: a fork's stream
// (fork.js) starts at the world's head, its timestamps continuing the world's.

const KEEP_BEHIND_S = 10; // played video kept in the buffer (older data is removed)

/** RFC 6381 codec string (avc1.PPCCLL) from the avcC box of an init segment, or null. */
export function codecFromInit(bytes) {
  for (let i = 4; i + 8 <= bytes.length; i++) {
    if (bytes[i] === 0x61 && bytes[i + 1] === 0x76 && bytes[i + 2] === 0x63 && bytes[i + 3] === 0x43) {
      const hex = (b) => b.toString(16).padStart(2, "0").toUpperCase();
      return `avc1.${hex(bytes[i + 5])}${hex(bytes[i + 6])}${hex(bytes[i + 7])}`; // profile, compat, level
    }
  }
  return null;
}

export class MsePlayer {
  constructor(video) {
    this.video = video;
    this.source = null;
    this.buffer = null;
    this.queue = [];
    this.onerror = () => {};
  }

  static supported(mimeType = 'video/mp4; codecs="avc1.42E01E"') {
    return "MediaSource" in window && MediaSource.isTypeSupported(mimeType);
  }

  /** Attach a fresh MediaSource for a session whose chunks have MIME type `mimeType`
   *  (`sequence`: chunks placed one after the other, their own timestamps ignored). */
  async open(mimeType, { sequence = false } = {}) {
    this.close();
    if (!MediaSource.isTypeSupported(mimeType)) {
      throw new Error(`this browser cannot play ${mimeType} through Media Source Extensions`);
    }
    const source = new MediaSource();
    this.source = source;
    this.video.src = URL.createObjectURL(source);
    await new Promise((resolve) => source.addEventListener("sourceopen", resolve, { once: true }));
    URL.revokeObjectURL(this.video.src);
    this.buffer = source.addSourceBuffer(mimeType);
    this.buffer.mode = sequence ? "sequence" : "segments";
    if (sequence) this.buffer.timestampOffset = 0; // the first chunk at 0 too, whatever its own time (MSE: sets the group start)
    this.buffer.addEventListener("updateend", () => this.pump());
    this.buffer.addEventListener("error", () => this.onerror(new Error("the video decoder rejected a chunk")));
  }

  get isOpen() { return this.buffer !== null; }

  /** Queue one chunk's bytes for playback. */
  append(bytes) {
    this.queue.push(bytes);
    this.pump();
  }

  /** Remove the video from `t` seconds on (queued after the chunks already queued; the
   *  playhead goes back to `t` when it was past it). */
  dropFrom(t) {
    this.queue.push({ dropFrom: t });
    this.pump();
  }

  /** Playback speed (1: 16 fps); see playback.js. */
  setRate(rate) {
    if (Math.abs(this.video.playbackRate - rate) > 0.01) this.video.playbackRate = rate;
  }

  pump() {
    const b = this.buffer;
    if (b === null || b.updating || this.source.readyState !== "open") return;
    const op = this.queue[0];
    if (op !== undefined && op.dropFrom !== undefined) {
      this.queue.shift();
      if (this.video.currentTime > op.dropFrom) this.video.currentTime = op.dropFrom;
      const end = b.buffered.length ? b.buffered.end(b.buffered.length - 1) : 0;
      if (end > op.dropFrom) { b.remove(op.dropFrom, end + 1); return; } // updateend calls pump again
    }
    if (b.buffered.length && this.video.currentTime < b.buffered.start(0)) { // a stream not starting at 0
      this.video.currentTime = b.buffered.start(0); // (a fork of a shared world: fork.js): play from its start
    }
    const played = this.video.currentTime - KEEP_BEHIND_S;
    if (b.buffered.length && played > b.buffered.start(0) + 1) {
      b.remove(0, played); // updateend calls pump again
      return;
    }
    const next = this.queue.shift();
    if (next === undefined) return;
    try {
      b.appendBuffer(next);
    } catch (e) {
      this.onerror(e);
      return;
    }
    if (this.video.paused) this.video.play().catch(() => {}); // muted autoplay; a click plays otherwise
  }

  /** Seconds of video buffered ahead of the playhead. */
  bufferedAhead() {
    const b = this.buffer;
    if (b === null || !b.buffered.length) return 0;
    return Math.max(0, b.buffered.end(b.buffered.length - 1) - this.video.currentTime);
  }

  close() {
    this.queue = [];
    this.buffer = null;
    if (this.source !== null) {
      this.video.removeAttribute("src");
      this.video.load();
      this.source = null;
    }
  }
}
