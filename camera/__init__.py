"""Camera geometry shared by protocol, model, client and server: chunk geometry and the frame
plan (`frames.py`), pose checks and pose math (`poses.py`), the chunk plan of a known
trajectory (`plan.py`).

A leaf: numpy only (SciPy is imported inside `interpolate_poses`); never torch, ray, PyAV or
another package of this project.
"""
from camera.frames import (CHUNK_LATENT_FRAMES, CHUNK_VIDEO_FRAMES, DEFAULT_INTRINSICS_RESOLUTION, DEFAULT_SIZE,
                           FIRST_CHUNK_VIDEO_FRAMES, FPS, MAX_CHUNKS, MAX_LATENT_FRAMES, MAX_NUM_FRAMES,
                           VAE_TIME_STRIDE, chunk_video_frames, frame_plan, num_chunks, output_size, parse_size,
                           planned_latent_frames)
from camera.plan import SessionPlan, plan_session
from camera.poses import (check_poses, chunk_cameras, chunk_latent_poses, interpolate_poses, max_translation_norm,
                          offline_latent_poses, relative_poses, rescale_intrinsics, rigid_errors, scale_translations,
                          translation_norms, translation_scale)

__all__ = [
    "CHUNK_LATENT_FRAMES", "CHUNK_VIDEO_FRAMES", "DEFAULT_INTRINSICS_RESOLUTION", "DEFAULT_SIZE",
    "FIRST_CHUNK_VIDEO_FRAMES", "FPS", "MAX_CHUNKS", "MAX_LATENT_FRAMES", "MAX_NUM_FRAMES", "SessionPlan",
    "VAE_TIME_STRIDE", "check_poses", "chunk_cameras", "chunk_latent_poses", "chunk_video_frames", "frame_plan",
    "interpolate_poses", "max_translation_norm", "num_chunks", "offline_latent_poses", "output_size",
    "parse_size", "plan_session", "planned_latent_frames", "relative_poses", "rescale_intrinsics",
    "rigid_errors", "scale_translations", "translation_norms", "translation_scale",
]
