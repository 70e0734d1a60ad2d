// The figures of a LiveStream's "stats" event (stream.js), from its counters.

function percentile(values, q) {
  if (!values.length) return null;
  const s = [...values].sort((a, b) => a - b);
  const pos = (s.length - 1) * q, lo = Math.floor(pos), hi = Math.ceil(pos);
  return s[lo] + (s[hi] - s[lo]) * (pos - lo);
}

/**
 * The `detail` of a "stats" event: chunks and frames received, requests in flight, time to the
 * first chunk (ttfc, s), the last chunk interval and its p50/p95 (s), the frames per second of
 * the last wait (fps), seconds buffered ahead, the resolution, the server's stage durations,
 * chunks from the prefix store (cached, lastCached), the control lag (s) and its p50, the last
 * event id shown, the playback rate, whether Undo can run, the state and the chunk being made.
 */
export function statsDetail(stream) {
  const s = stream.stats;
  return {
    chunks: s.chunks, frames: s.frames, inFlight: s.inFlight, ttfc: s.ttfc,
    lastInterval: s.intervals.length ? s.intervals[s.intervals.length - 1] : null,
    p50: percentile(s.intervals, 0.5), p95: percentile(s.intervals, 0.95), fps: s.lastFps,
    bufferedS: stream.player.bufferedAhead(), resolution: s.resolution, stages: s.lastStages || null,
    cached: s.cached, lastCached: s.lastCached,
    controlLag: s.lags.length ? s.lags[s.lags.length - 1] : null, controlLagP50: percentile(s.lags, 0.5),
    eventId: s.lastEventId, playback: stream.pacer.describe(), playbackRate: stream.pacer.rate,
    canUndo: stream.state === "streaming" && stream.undoTo === null && s.chunks >= 2,
    state: stream.state, startedAt: s.startedAt, generating: s.inFlight > 0 ? stream.nextChunk - 1 : null,
  };
}
