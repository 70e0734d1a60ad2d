// Where the camera WebSocket is: the server's base URL -> ws(s)://.../v1/realtime/world/camera
// (and the watch route's, /v1/realtime/world/watch, where viewers of a shared world connect).
// By default the server this module was loaded from, so a page on another origin that imports
// http://host:8000/static/stream.js talks to host:8000 (web/README.md, "Embedding").
// An API key goes in the socket's subprotocol (`keyProtocols`), never in its URL: URLs end up in
// logs and history, and a browser cannot set a header on a WebSocket.

export const CAMERA_PATH = "v1/realtime/world/camera";
export const WATCH_PATH = "v1/realtime/world/watch";
export const BEARER_PROTOCOL = "lwf.bearer."; // + the key: the subprotocol the server reads keys from

/** The server this module was loaded from (its /static/ folder's parent, route prefix kept). */
export const MODULE_SERVER = new URL("../", import.meta.url).href;

// RFC 7230 token characters: all a WebSocket subprotocol may hold (others throw in `new WebSocket`).
const TOKEN = /^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$/;

/**
 * ws(s):// URL of the camera endpoint of `server` (http(s):// or ws(s)://, with any route
 * prefix: "https://host/world" and "https://host/world/" are the same server).
 * @param {string} [server] the server's base URL; default: the one this module came from
 * @returns {string}
 */
export function cameraUrl(server = MODULE_SERVER) {
  return socketUrl(server, CAMERA_PATH);
}

/**
 * ws(s):// URL of the watch route of `server` (a shared world's viewers: PROTOCOL.md "The watch route").
 * @param {string} [server] the server's base URL; default: the one this module came from
 * @returns {string}
 */
export function watchUrl(server = MODULE_SERVER) {
  return socketUrl(server, WATCH_PATH);
}

function socketUrl(server, path) {
  const base = new URL(server, globalThis.location ? globalThis.location.href : undefined);
  if (!base.pathname.endsWith("/")) base.pathname += "/";
  const url = new URL(path, base);
  url.protocol = url.protocol === "https:" || url.protocol === "wss:" ? "wss:" : "ws:";
  url.search = "";
  url.hash = "";
  return url.toString();
}

/**
 * The subprotocols that carry `apiKey` (`new WebSocket(url, keyProtocols(key))`): the server
 * accepts the socket with `lwf.bearer.<key>` and echoes it. None without a key.
 * @param {string} [apiKey]
 * @returns {string[]}
 * @throws {Error} code "client" when the key holds a character a subprotocol cannot carry
 */
export function keyProtocols(apiKey = "") {
  if (!apiKey) return [];
  if (!TOKEN.test(apiKey)) {
    throw Object.assign(new Error("this API key has characters a browser cannot send (a WebSocket subprotocol "
      + "holds letters, digits and !#$%&'*+-.^_`|~ only); ask for a key made of those"), { code: "client" });
  }
  return [BEARER_PROTOCOL + apiKey];
}
