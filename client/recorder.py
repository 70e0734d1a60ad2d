"""`--save-session DIR`: what a CLI session sent and received, kept to replay and compare.

    DIR/session.json          the command line, session ids, the branch point and per branch
                              its chunk count and MP4
    DIR/inputs/               the main session's trajectory in the example format (replay it
                              with `lwf-client play DIR/inputs`), when it had one
    DIR/<branch>.mp4          the whole video of each branch ("main", "branch")
    DIR/<branch>/chunk_KKKK.m4s   each frame reply's fMP4 payload as received (chunk 0 of
                              "main" starts with the init segment)
    DIR/<branch>/replies.jsonl    one line per frame reply: chunk_id, num_frames, resolution,
                              event_id, poses [12][4][4], stage_durations, the payload's size
                              and sha256
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any, Optional

from client.trajectory import Trajectory
from protocol.messages import FrameReply


class SessionRecorder:
    """Writes one CLI run into a folder as its replies arrive."""

    def __init__(self, folder: Path) -> None:
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        self.meta: dict[str, Any] = {"branches": {}}

    def inputs(self, trajectory: Optional[Trajectory], **meta: Any) -> None:
        """The session's inputs: its trajectory (when it has one) and what else describes it."""
        if trajectory is not None:
            trajectory.save(self.folder / "inputs")
        self.meta.update(meta)
        self._write_meta()

    def reply(self, branch: str, reply: FrameReply) -> None:
        """One frame reply of `branch`, as received."""
        folder = self.folder / branch
        folder.mkdir(exist_ok=True)
        video = bytes(reply.video)
        (folder / f"chunk_{reply.chunk_id:04d}.m4s").write_bytes(video)
        line = {"chunk_id": reply.chunk_id, "num_frames": reply.num_frames, "resolution": list(reply.resolution),
                "event_id": reply.event_id, "poses": None if reply.poses is None else reply.poses.tolist(),
                "stage_durations": dict(reply.stage_durations), "video_bytes": len(video),
                "video_sha256": hashlib.sha256(video).hexdigest()}
        with (folder / "replies.jsonl").open("a", encoding="utf-8") as f:
            f.write(json.dumps(line) + "\n")
        entry = self.meta["branches"].setdefault(branch, {"chunks": 0, "video": f"{branch}.mp4"})
        entry["chunks"] += 1
        self._write_meta()

    def video(self, branch: str, data: bytes) -> Path:
        """The whole MP4 of `branch`."""
        path = self.folder / f"{branch}.mp4"
        path.write_bytes(data)
        self.meta["branches"].setdefault(branch, {"chunks": 0, "video": path.name})
        self._write_meta()
        return path

    def _write_meta(self) -> None:
        (self.folder / "session.json").write_text(json.dumps(self.meta, indent=2) + "\n", encoding="utf-8")
