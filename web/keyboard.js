// The keyboard's driving keys (camera.js: WASD, Q/E, arrows/IJKL) into a KeyControl: the main
// page's session (app.js) and a viewer's turn at a shared world's controls (viewer.js) take the
// same keys the same way. A key typed in a field is not taken; leaving the window releases all.

import { CONTROL_CODES } from "./camera.js";

const typing = (el) => el instanceof HTMLInputElement || el instanceof HTMLTextAreaElement || el instanceof HTMLSelectElement;

/**
 * @param {import("./camera.js").KeyControl} keys where the key states go
 * @param {() => boolean} [enabled] whether a key pressed now is taken (a release always is)
 */
export function bindKeyboard(keys, enabled = () => true) {
  window.addEventListener("keydown", (e) => {
    if (typing(e.target) || !CONTROL_CODES.has(e.code) || !enabled()) return;
    e.preventDefault();
    keys.keyDown(e.code);
  });
  window.addEventListener("keyup", (e) => {
    if (CONTROL_CODES.has(e.code)) keys.keyUp(e.code);
  });
  window.addEventListener("blur", () => keys.releaseAll());
}
