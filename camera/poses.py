"""Camera pose math shared by client and server (numpy; SciPy only inside `interpolate_poses`).

Spec B.5 (pose interpolation, frame-to-frame relative poses, translation normalisation) and
the chunk rule of PROTOCOL.md (`infer.cameras`):

* the reference (offline) samples one pose per latent frame at `linspace(0, n-1, lat_f)` of the
  n = frame_num source poses (`offline_latent_poses`) and divides relative translations by the
  largest norm over the whole trajectory (`translation_scale`);
* a streaming chunk carries N poses; pose i sits at local frame i*12/N of the chunk's 12-frame
  span and latent frame j uses local frame 4j (`chunk_latent_poses`).

Poses are OpenCV camera-to-world [.., 4, 4]; intrinsics rows are (fx, fy, cx, cy).
Interpolation runs in float64 (SciPy's Slerp and interp1d, as the reference; where SciPy is not
installed, as in the client package, the same slerp written in numpy, within a few float32
ulps of it: tests/camera/test_poses.py); the relative poses, their normalisation and the
intrinsics are float32 in the reference, and are reproduced here with its rounding. SciPy is
imported where it is used, so that `import camera` (and with it `import protocol`) loads numpy
only.
"""
from __future__ import annotations

import math

import numpy as np

from camera.frames import CHUNK_LATENT_FRAMES, CHUNK_VIDEO_FRAMES, VAE_TIME_STRIDE, frame_plan


def check_poses(poses: np.ndarray, name: str = "poses") -> np.ndarray:
    """`poses` as a finite [N, 4, 4] array (N >= 1), else ValueError."""
    poses = np.asarray(poses)
    if poses.ndim != 3 or poses.shape[1:] != (4, 4) or poses.shape[0] < 1:
        raise ValueError(f"{name} must be [N, 4, 4] with N >= 1, got {poses.shape}")
    if not np.isfinite(poses).all():
        raise ValueError(f"{name} contain non-finite values")
    return poses


def rigid_errors(poses: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """How far each pose [N, 4, 4] is from a rotation + translation, in float64, per pose:
    (max|R^T R - I|, det R, max|last row - (0, 0, 0, 1)|)."""
    poses = np.asarray(poses, dtype=np.float64)
    rot = poses[:, :3, :3]  # [N, 3, 3]
    ortho = np.abs(np.swapaxes(rot, 1, 2) @ rot - np.eye(3)).max(axis=(1, 2))  # [N]
    last_row = np.abs(poses[:, 3, :] - np.array([0.0, 0.0, 0.0, 1.0])).max(axis=1)  # [N]
    return ortho, np.linalg.det(rot), last_row


def interpolate_poses(poses: np.ndarray, positions: np.ndarray) -> np.ndarray:
    """Poses at fractional source positions (spec B.5) -> float32 [m, 4, 4].

    Source pose k sits at position k. Translation: linear (scipy interp1d); rotation:
    quaternions made sign-continuous (q_i flipped when q_i . q_{i-1} < 0), then scipy Slerp;
    computed in float64. Without SciPy: `_interpolate_numpy`.
    """
    poses = check_poses(poses)
    positions = np.asarray(positions, dtype=np.float64)
    n = poses.shape[0]
    if n < 2:
        raise ValueError("interpolation needs at least 2 poses")
    if positions.ndim != 1 or positions.min() < 0 or positions.max() > n - 1:
        raise ValueError(f"positions must be 1-D within [0, {n - 1}], got {positions}")
    try:
        from scipy.interpolate import interp1d
        from scipy.spatial.transform import Rotation, Slerp
    except ImportError:  # the client package installs no SciPy
        trans, rot = _interpolate_numpy(poses.astype(np.float64), positions)
    else:
        src = np.arange(n)
        trans = interp1d(src, poses[:, :3, 3], axis=0, kind="linear", bounds_error=False,
                         fill_value="extrapolate")(positions)
        quats = Rotation.from_matrix(poses[:, :3, :3]).as_quat()  # [n, 4]
        for i in range(1, n):  # sequential: compares with the already-fixed predecessor
            if np.dot(quats[i], quats[i - 1]) < 0:
                quats[i] = -quats[i]
        rot = Slerp(src, Rotation.from_quat(quats))(positions).as_matrix()  # [m, 3, 3]
    out = np.zeros((positions.shape[0], 4, 4), dtype=np.float32)
    out[:, :3, :3] = rot
    out[:, :3, 3] = trans
    out[:, 3, 3] = 1.0
    return out


def _interpolate_numpy(src: np.ndarray, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """SciPy's linear interpolation and Slerp in numpy: r_k * (r_k^-1 r_k+1)^alpha, the shorter
    way round (the relative rotation's, whatever the quaternions' signs) -> ([m, 3], [m, 3, 3])."""
    left = np.clip(np.floor(positions).astype(np.int64), 0, src.shape[0] - 2)  # [m] interval of each position
    alpha = (positions - left)[:, None]  # [m, 1]
    trans = src[left, :3, 3] + (src[left + 1, :3, 3] - src[left, :3, 3]) * alpha  # [m, 3] as interp1d
    quats = _quat_from_matrix(src[:, :3, :3])  # [n, 4] (x, y, z, w)
    rel = _quat_mul(_quat_conj(quats[left]), quats[left + 1])  # [m, 4]
    return trans, _quat_to_matrix(_quat_mul(quats[left], _quat_pow(rel, alpha[:, 0])))


def _quat_from_matrix(rot: np.ndarray) -> np.ndarray:
    """Rotation matrices [n, 3, 3] -> unit quaternions [n, 4] (x, y, z, w), Markley's method
    (scipy's `Rotation.from_matrix`: the largest of the diagonal and the trace decides)."""
    n = rot.shape[0]
    decision = np.concatenate([np.diagonal(rot, axis1=1, axis2=2), np.trace(rot, axis1=1, axis2=2)[:, None]], 1)
    choice = decision.argmax(axis=1)  # [n]
    quat = np.empty((n, 4))
    for k in range(n):
        m, c = rot[k], choice[k]
        if c != 3:
            i, j, l = c, (c + 1) % 3, (c + 2) % 3
            quat[k, i] = 1 - decision[k, 3] + 2 * m[i, i]
            quat[k, j] = m[j, i] + m[i, j]
            quat[k, l] = m[l, i] + m[i, l]
            quat[k, 3] = m[l, j] - m[j, l]
        else:
            quat[k] = (m[2, 1] - m[1, 2], m[0, 2] - m[2, 0], m[1, 0] - m[0, 1], 1 + decision[k, 3])
    return quat / np.linalg.norm(quat, axis=1, keepdims=True)


def _quat_conj(q: np.ndarray) -> np.ndarray:
    return q * np.array([-1.0, -1.0, -1.0, 1.0])


def _quat_mul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Hamilton products of [m, 4] (x, y, z, w) quaternions."""
    av, aw, bv, bw = a[:, :3], a[:, 3:], b[:, :3], b[:, 3:]
    return np.concatenate([aw * bv + bw * av + np.cross(av, bv), aw * bw - (av * bv).sum(1, keepdims=True)], 1)


def _quat_pow(q: np.ndarray, t: np.ndarray) -> np.ndarray:
    """q^t for unit quaternions [m, 4] and exponents [m], the shorter way round (w >= 0)."""
    q = np.where(q[:, 3:] < 0, -q, q)
    half = np.arctan2(np.linalg.norm(q[:, :3], axis=1), q[:, 3])  # [m] half the rotation angle
    scaled = half * t
    ratio = np.where(half > 1e-12, np.sin(scaled) / np.where(half > 1e-12, np.sin(half), 1.0), t)
    return np.concatenate([q[:, :3] * ratio[:, None], np.cos(scaled)[:, None]], 1)


def _quat_to_matrix(q: np.ndarray) -> np.ndarray:
    x, y, z, w = q.T
    return np.stack([
        np.stack([1 - 2 * (y * y + z * z), 2 * (x * y - z * w), 2 * (x * z + y * w)], -1),
        np.stack([2 * (x * y + z * w), 1 - 2 * (x * x + z * z), 2 * (y * z - x * w)], -1),
        np.stack([2 * (x * z - y * w), 2 * (y * z + x * w), 1 - 2 * (x * x + y * y)], -1),
    ], 1)


def _matmul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """a @ b over the last two axes, summing k = 0, 1, ... in order without FMA (float32
    results then equal torch's CPU bmm of the reference bit for bit)."""
    prod = a[..., :, :, None] * b[..., None, :, :]  # [.., i, k, j]
    out = prod[..., :, 0, :]
    for k in range(1, a.shape[-1]):
        out = out + prod[..., :, k, :]
    return out


def _se3_inverse(poses: np.ndarray) -> np.ndarray:
    """Inverse of rigid transforms [m, 4, 4]: (R^T, -R^T t)."""
    rot_t = np.swapaxes(poses[:, :3, :3], -1, -2)
    out = np.zeros_like(poses)
    out[:, :3, :3] = rot_t
    out[:, :3, 3:] = -_matmul(rot_t, poses[:, :3, 3:])
    out[:, 3, 3] = 1.0
    return out


def relative_poses(
    poses: np.ndarray, prev: np.ndarray | None = None, anchor: np.ndarray | None = None
) -> np.ndarray:
    """Frame-to-frame relative poses rel_k = P_{k-1}^-1 P_k (spec B.5) -> float32 [m, 4, 4].

    Computed exactly as the reference does, in float32: every pose is first taken relative to
    the session's first pose (`anchor`), A_k = anchor^-1 P_k, then rel_k = A_{k-1}^-1 A_k.
    Scene coordinates can be large next to the frame-to-frame motion, so this order (and its
    float32 rounding) matters to reproduce the reference. At the session start (`prev` None)
    the anchor is poses[0] and rel_0 = I; later chunks pass the previous chunk's last pose
    as `prev` and the session's first pose as `anchor`. Translations are not scaled here.
    """
    poses = check_poses(poses).astype(np.float32)
    eye = np.eye(4, dtype=np.float32)
    if prev is None:
        if anchor is not None:
            raise ValueError("an anchor is only used together with prev (the session's first pose)")
        anchored = _matmul(_se3_inverse(poses[:1]), poses)  # [m, 4, 4]
        anchored[0] = eye
        rel = np.empty_like(anchored)
        rel[0] = eye
        rel[1:] = _matmul(_se3_inverse(anchored[:-1]), anchored[1:])
        return rel
    if anchor is None:
        raise ValueError("relative poses after a previous pose need the session's anchor pose")
    prev = check_poses(np.asarray(prev)[None], "prev pose").astype(np.float32)
    anchor = check_poses(np.asarray(anchor)[None], "anchor pose").astype(np.float32)
    anchored = _matmul(_se3_inverse(anchor), np.concatenate([prev, poses]))  # [m + 1, 4, 4]
    return _matmul(_se3_inverse(anchored[:-1]), anchored[1:])


def translation_norms(rel: np.ndarray) -> np.ndarray:
    """float32 norms of the translations of [m, 4, 4], rounded like torch.norm on a CPU
    (fused multiply-adds: fma(z, z, fma(y, y, x*x)); float64 products of float32 are exact)."""
    t = rel[:, :3, 3].astype(np.float64)
    acc = (t[:, 0] * t[:, 0]).astype(np.float32)
    acc = (t[:, 1] * t[:, 1] + acc).astype(np.float32)
    acc = (t[:, 2] * t[:, 2] + acc).astype(np.float32)
    return np.sqrt(acc)


def max_translation_norm(rel: np.ndarray) -> float:
    """Largest translation norm of relative poses [m, 4, 4]."""
    return float(translation_norms(rel).max())


def scale_translations(rel: np.ndarray, scale: float | None = None) -> np.ndarray:
    """Divide translations by `scale`, or by their own max norm when None (no-op when 0).
    float32 in, float32 out (the division is the reference's float32 one)."""
    if scale is None:
        scale = max_translation_norm(rel)
    elif not (math.isfinite(scale) and scale >= 0):
        raise ValueError(f"translation_scale must be finite and >= 0, got {scale}")
    out = np.array(rel, dtype=np.float32)
    if scale > 0:
        out[:, :3, 3] = out[:, :3, 3] / np.float32(scale)
    return out


def offline_latent_poses(
    poses: np.ndarray, frame_num_requested: int, chunk_size: int = CHUNK_LATENT_FRAMES
) -> np.ndarray:
    """The reference's latent-frame poses: the trajectory cut to frame_num and sampled at
    linspace(0, frame_num-1, lat_f) (spec B.5, H.3) -> float32 [lat_f, 4, 4]."""
    poses = check_poses(poses)
    frame_num, lat_f, _ = frame_plan(frame_num_requested, poses.shape[0], chunk_size)
    return interpolate_poses(poses[:frame_num], np.linspace(0, frame_num - 1, lat_f))


def translation_scale(poses: np.ndarray, frame_num: int) -> float:
    """The reference's normaliser: the max relative translation norm over the latent-frame
    trajectory. A client that knows its whole trajectory sends this as `translation_scale`."""
    return max_translation_norm(relative_poses(offline_latent_poses(poses, frame_num)))


def chunk_cameras(
    poses: np.ndarray, intrinsics: np.ndarray, k: int
) -> tuple[np.ndarray, np.ndarray]:
    """Chunk k's slice poses[12k:12k+12] (and intrinsics) of a trajectory.

    A trajectory whose length is 12k + r (r < 12) has a short tail: its slice is padded to 12
    by holding the last pose, so that the N = 12 rule still places pose i at local frame i
    (a 4n+1 trajectory ends with 9 poses: local frames 0, 4, 8 are all real poses).
    """
    poses = check_poses(poses)
    intrinsics = np.asarray(intrinsics)
    if intrinsics.shape != (poses.shape[0], 4):
        raise ValueError(f"intrinsics must be [{poses.shape[0]}, 4], got {intrinsics.shape}")
    start = CHUNK_VIDEO_FRAMES * k
    if k < 0 or start >= poses.shape[0]:
        raise ValueError(f"chunk {k} starts at frame {start}, beyond the {poses.shape[0]} poses")
    idx = np.minimum(np.arange(start, start + CHUNK_VIDEO_FRAMES), poses.shape[0] - 1)
    return poses[idx], intrinsics[idx]


def chunk_latent_poses(chunk_poses: np.ndarray) -> np.ndarray:
    """The 3 latent-frame poses of one chunk from its N poses (PROTOCOL `infer.cameras`).

    Pose i sits at local frame i*12/N; latent frame j uses local frame 4j, interpolated
    (slerp, linear). N = 12 picks poses 0, 4, 8; N = 3 uses the poses as given; N = 1 holds
    still; beyond the last pose (N = 2) the last pose is held. -> float32 [3, 4, 4].
    """
    chunk_poses = check_poses(chunk_poses, "chunk poses")
    n = chunk_poses.shape[0]
    if n == 1:
        return np.repeat(chunk_poses.astype(np.float32), CHUNK_LATENT_FRAMES, axis=0)
    if n == CHUNK_LATENT_FRAMES:  # one pose per latent frame: used exactly as sent
        return chunk_poses.astype(np.float32)
    local = VAE_TIME_STRIDE * np.arange(CHUNK_LATENT_FRAMES)  # local frames 0, 4, 8
    positions = np.minimum(local * n / CHUNK_VIDEO_FRAMES, n - 1)
    return interpolate_poses(chunk_poses, positions)


def rescale_intrinsics(
    k: np.ndarray, from_hw: tuple[int, int], to_hw: tuple[int, int]
) -> np.ndarray:
    """(fx, fy, cx, cy) given for a from_hw frame, rescaled to to_hw (no crop) -> float32 [4].

    fx, cx scale by the width ratio and fy, cy by the height ratio, multiplied in float32
    like the reference's torch code."""
    k = np.asarray(k)
    if k.shape != (4,) or not np.isfinite(k).all() or k[0] <= 0 or k[1] <= 0:
        raise ValueError(f"intrinsics row must be finite (fx, fy, cx, cy) with fx, fy > 0, got {k}")
    if min(from_hw) <= 0 or min(to_hw) <= 0:
        raise ValueError(f"resolutions must be positive, got {from_hw} -> {to_hw}")
    sy, sx = to_hw[0] / from_hw[0], to_hw[1] / from_hw[1]
    return k.astype(np.float32) * np.array([sx, sy, sx, sy], dtype=np.float32)
