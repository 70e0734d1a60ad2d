// Where the camera WebSocket is: the server's base URL -> ws(s)://.../v1/realtime/world/camera.
// By default the server this module was loaded from, so a page on another origin that imports
// http://host:8000/static/stream.js talks to host:8000 (web/README.md, "Embedding").

export const CAMERA_PATH = "v1/realtime/world/camera";

/** The server this module was loaded from (its /static/ folder's parent, route prefix kept). */
export const MODULE_SERVER = new URL("../", import.meta.url).href;

/**
 * ws(s):// URL of the camera endpoint of `server` (http(s):// or ws(s)://, with any route
 * prefix: "https://host/world" and "https://host/world/" are the same server).
 * @param {string} [server] the server's base URL; default: the one this module came from
 * @param {string} [apiKey] sent as the `api_key` query parameter when given
 * @returns {string}
 */
export function cameraUrl(server = MODULE_SERVER, apiKey = "") {
  const base = new URL(server, globalThis.location ? globalThis.location.href : undefined);
  if (!base.pathname.endsWith("/")) base.pathname += "/";
  const url = new URL(CAMERA_PATH, base);
  url.protocol = url.protocol === "https:" || url.protocol === "wss:" ? "wss:" : "ws:";
  url.search = "";
  url.hash = "";
  if (apiKey) url.searchParams.set("api_key", apiKey);
  return url.toString();
}

