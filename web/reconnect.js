// Resume after a dropped socket (PROTOCOL.md, resume): a new socket to the same server sends
// `resume` with the session's token and the count of frames the page has; the missed frames
// come again, then `resumed` says which chunk to request next (LiveStream.onResumed). A socket
// that drops while the session waits in the server's line takes its place again (rejoinLine),
// with the `queue_token` of the line's `queued` reply (onQueued).

import { encode } from "./msgpack.js";

const RESUME_ATTEMPTS = 5;
const RESUME_BACKOFF_MS = 500; // doubling; an `unauthorized` while the server parks is retried too

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

/** The socket dropped mid-session: reconnect and resume (RESUME_ATTEMPTS tries), else fail. */
export async function resumeAfterDrop(stream, why) {
  stream.setState("resuming");
  stream.resumes = (stream.resumes || 0) + 1;
  for (let attempt = 0; attempt < RESUME_ATTEMPTS; attempt++) {
    stream.status(`Connection lost (${why}); resuming the session…`, "warn");
    if (attempt) await sleep(RESUME_BACKOFF_MS * 2 ** (attempt - 1));
    if (stream.state !== "resuming") return; // reset or a new session meanwhile
    try {
      await stream.connect(stream.apiKey, true);
      if (await sendResume(stream)) return;
    } catch (e) {
      why = e.message;
      if (e.final) break; // the server refused the resume (e.g. its grace period ended)
    }
  }
  stream.setState("stopped");
  stream.fail("connection", `connection lost (${why}); the session could not be resumed. Press Start to begin again`);
}

/** Send `resume`; true once `resumed` came (the frames before it are played as they come),
 *  false on `unauthorized` (not parked yet: try again), rejects on another error or a close. */
function sendResume(stream) {
  return new Promise((resolve, reject) => {
    stream.resumeWaiter = { resolve, reject };
    stream.ws.send(encode({ endpoint: "resume", session_id: stream.sessionId, resume_token: stream.resumeToken,
                          resume_from: stream.stats.chunks }));
  }).finally(() => { stream.resumeWaiter = null; });
}


/** The socket dropped while the session waited in the server's line (no frame yet): a new
 *  socket sends the first infer again with the line's `queue_token`, which takes its old place
 *  (within the server's grace period). */
export async function rejoinLine(stream, why) {
  for (let attempt = 0; attempt < RESUME_ATTEMPTS; attempt++) {
    stream.status(`Connection lost while waiting in line (${why}); taking the place again…`, "warn");
    if (attempt) await sleep(RESUME_BACKOFF_MS * 2 ** (attempt - 1));
    try {
      await stream.connect(stream.apiKey, true);
    } catch (e) {
      why = e.message;
      continue;
    }
    stream.setState("starting");
    stream.nextChunk = 0;
    stream.stats.inFlight = 0;
    stream.sendChunk(); // with queue_token
    stream.startTimer();
    return;
  }
  stream.setState("stopped");
  stream.fail("connection", `connection lost (${why}) while waiting in line. Press Start to try again`);
}

/** The session waits in the server's line for a place (PROTOCOL.md, the waiting room). */
export function onQueued(stream, msg) {
  if (msg.session_id !== stream.sessionId || stream.state !== "starting") return;
  stream.queueToken = msg.queue_token; // a dropped socket takes its place again with it (rejoinLine)
  stream.queued = { position: msg.position, eta_s: msg.eta_s };
  const eta = msg.eta_s == null ? "" : `; it should start in about ${Math.round(msg.eta_s)} s`;
  stream.status(`The server is full: your session waits in line, position ${msg.position}${eta}…`, "warn");
  stream.dispatchEvent(new CustomEvent("queued", { detail: stream.queued }));
}
