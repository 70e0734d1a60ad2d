"""`lwf-client compare A.mp4 B.mp4 ... -o side_by_side.html`: the videos side by side in one
self-contained HTML page, played by the browser, so nothing is decoded here: the comparison of
the client's core install (no PyAV; the MP4 output needs the `video` extra, client/compare.py).

Each video is embedded as a data URL (base64 of its bytes, as written by the CLI: fMP4 plays in
every current browser) under its label; one control plays, pauses and seeks them together.
"""
from __future__ import annotations

import base64
import html
from collections.abc import Sequence
from pathlib import Path

PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>{title}</title>
<style>
body {{ background: #111; color: #eee; font: 14px system-ui, sans-serif; margin: 16px; }}
.row {{ display: flex; gap: 4px; align-items: flex-start; flex-wrap: wrap; }}
figure {{ margin: 0; }} figcaption {{ padding: 4px 0; }} video {{ display: block; max-width: 100%; }}
button {{ margin: 8px 8px 8px 0; }}
</style></head><body>
<div class="row">{figures}</div>
<button id="play">play / pause</button><button id="restart">from the start</button>
<script>
const videos = [...document.querySelectorAll("video")];
document.getElementById("play").onclick = () => {{
  const paused = videos[0].paused;
  videos.forEach((v) => (paused ? v.play() : v.pause()));
}};
document.getElementById("restart").onclick = () => videos.forEach((v) => {{ v.currentTime = 0; v.play(); }});
videos[0].addEventListener("seeked", () => videos.slice(1).forEach((v) => {{ v.currentTime = videos[0].currentTime; }}));
</script></body></html>
"""
FIGURE = ('<figure><figcaption>{label}</figcaption>'
          '<video src="data:video/mp4;base64,{data}" muted playsinline preload="auto"></video></figure>')


def compare_page(inputs: Sequence[Path], out: Path, labels: Sequence[str] | None = None) -> int:
    """Write the page of `inputs` to `out` (each named by its label, default its file name);
    the videos' bytes embedded."""
    if len(inputs) < 2:
        raise ValueError("compare needs at least two videos")
    if labels is not None and len(labels) != len(inputs):
        raise ValueError(f"--labels names {len(labels)} videos, {len(inputs)} are given")
    names = labels if labels is not None else [p.name for p in inputs]
    figures = []
    for path, label in zip(inputs, names):
        data = path.read_bytes()
        if data[4:8] != b"ftyp":
            raise ValueError(f"{path}: not an MP4 file (no ftyp box)")
        figures.append(FIGURE.format(label=html.escape(label), data=base64.b64encode(data).decode()))
    out.write_text(PAGE.format(title=html.escape(" | ".join(names)), figures="".join(figures)), encoding="utf-8")
    return len(inputs)
