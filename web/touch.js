// On-screen pads for touch screens (and a mouse): each button holds its key while pressed, as the
// keyboard does (camera.js: a short tap still moves the camera for one chunk). The pads show on
// touch devices (`body.touch`); the drag on the video still looks around.

/** Wire the pad buttons under `root` to `keys` (camera.js KeyControl). */
export function bindPads(root, keys) {
  for (const button of root.querySelectorAll("button[data-code]")) {
    const code = button.dataset.code;
    const release = (e) => {
      if (!button.classList.contains("held")) return;
      button.classList.remove("held");
      keys.keyUp(code);
      e.preventDefault();
    };
    button.addEventListener("pointerdown", (e) => {
      e.preventDefault(); // no focus change, no text selection, no emulated mouse events
      e.stopPropagation();
      try { button.setPointerCapture(e.pointerId); } catch { /* a synthetic event's pointer: nothing to capture */ }
      button.classList.add("held");
      keys.keyDown(code);
    });
    button.addEventListener("pointerup", release);
    button.addEventListener("pointercancel", release);
    button.addEventListener("contextmenu", (e) => e.preventDefault()); // a long press holds, no menu
  }
}

/** True on a touch screen (the pads are shown there). */
export function isTouch() {
  return window.matchMedia("(pointer: coarse)").matches || navigator.maxTouchPoints > 0;
}
