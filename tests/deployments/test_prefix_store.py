"""The prefix store (deployments/ingress/prefix/): its keys, its trie per namespace and its LRU
eviction by bytes, and the config that turns it on."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from pydantic import ValidationError

from deployments.config import AppArgs
from deployments.ingress.guards.connection_caps import UNKNOWN_CLIENT
from deployments.ingress.prefix.keys import PrefixCursor, chunk_key, model_fingerprint, namespace
from deployments.ingress.prefix.reuse import scope_of
from deployments.ingress.prefix.store import PrefixStore, StoredChunk
from deployments.wire import NoiseSnapshot, PastChunk, SessionOptions

SPEC = SessionOptions(session_id="a", prompt="a street", image_digest="d" * 64, resolution=(32, 48),
                      seed=42, total_latent_frames=9, translation_scale=None, intrinsics_resolution=(480, 832))
CONTEXT = np.zeros((4, 8), np.float32)  # 128 bytes


def stored(tag: int, video_bytes: int = 1000) -> StoredChunk:
    """A chunk whose arrays hold `tag` (journal part: poses 256 + intrinsics 192 + y 128 + latents 128 + noise 16 = 720 bytes)."""
    past = PastChunk(np.full((4, 4, 4), tag, np.float32), np.full((12, 4), tag, np.float32),
                     np.full((2, 4, 4), tag, np.float32), np.full((2, 4, 4), tag, np.float32))
    noise = NoiseSnapshot(np.zeros(16, np.uint8), False)
    return StoredChunk(bytes([tag % 256]) * video_bytes, 12, "video/mp4", past, noise)


def poses(shift: float) -> np.ndarray:
    p = np.tile(np.eye(4, dtype=np.float32), (12, 1, 1))
    p[:, 0, 3] = shift
    return p


INTRINSICS = np.tile(np.array([500, 500, 416, 240], np.float32), (12, 1))


def test_the_namespace_is_every_input_that_changes_the_output_and_nothing_else():
    fp = model_fingerprint(AppArgs())
    base = namespace(fp, SPEC, "key:a")
    assert namespace(fp, dataclasses.replace(SPEC, session_id="other"), "key:a") == base  # the id is not an input
    for change in ({"prompt": "a road"}, {"image_digest": "e" * 64}, {"seed": 43}, {"resolution": (48, 32)},
                   {"total_latent_frames": None}, {"translation_scale": 1.5}, {"intrinsics_resolution": (720, 1280)},
                   {"raw_frames": True}):
        assert namespace(fp, dataclasses.replace(SPEC, **change), "key:a") != base, change
    assert namespace(fp, SPEC, "key:b") != base and namespace(fp, SPEC, "global") != base
    for model in ({"dtype": "bfloat16"}, {"local_attn_size": 6, "sink_size": 3}, {"checkpoint": "/w", "preset": "tiny"},
                  {"kv_cache": "fp8"}):
        other = AppArgs.model_validate({"model": model})
        assert namespace(model_fingerprint(other), SPEC, "key:a") != base, model
    assert namespace(model_fingerprint(AppArgs.model_validate({"sessions": {"kv_budget_gib": 2}})), SPEC,
                     "key:a") != base  # the budget decides full attention or the window
    assert model_fingerprint(AppArgs.model_validate({"model": {"warmup": False, "prompt_cache_size": 3}})) == fp


def test_the_chunk_key_is_the_camera_and_the_prompt_update():
    k = chunk_key(poses(0.0), INTRINSICS, None)
    assert chunk_key(poses(0.0).astype(np.float64), INTRINSICS, None) == k  # as the DiT gets it: float32
    assert chunk_key(poses(0.1), INTRINSICS, None) != k
    assert chunk_key(poses(0.0), INTRINSICS * 2, None) != k
    assert chunk_key(poses(0.0), INTRINSICS, "snow") != k and chunk_key(poses(0.0), INTRINSICS, "") != k
    assert chunk_key(poses(0.0)[:6], INTRINSICS[:6], None) != k


def test_a_trie_per_namespace_serves_the_stored_prefix_only():
    s = PrefixStore(1 << 20)
    assert s.put("ns", ["a"], stored(0), CONTEXT) and s.put("ns", ["a", "b"], stored(1), CONTEXT)
    assert s.put("ns", ["a", "c"], stored(2), CONTEXT)  # a branch
    assert not s.put("ns", ["a", "b"], stored(9), CONTEXT)  # held already: kept as it was
    assert not s.put("ns", ["x", "y"], stored(3), CONTEXT)  # its chunk 0 is not stored
    assert s.get("ns", ["a"]).past.poses[0, 0, 0] == 0
    assert s.get("ns", ["a", "b"]).video == bytes([1]) * 1000
    assert s.get("ns", ["a", "c"]).video == bytes([2]) * 1000
    assert s.get("ns", ["b"]) is None and s.get("ns", ["a", "b", "c"]) is None and s.get("other", ["a"]) is None
    assert s.get("ns", []) is None
    np.testing.assert_array_equal(s.context("ns"), CONTEXT)
    assert s.context("other") is None
    one = stored(0).nbytes
    assert one == 1000 + 720 and s.nbytes == 3 * one + CONTEXT.nbytes and len(s) == 4


def test_eviction_keeps_the_bytes_under_the_budget_least_recently_used_first():
    one = stored(0).nbytes
    s = PrefixStore(3 * one + CONTEXT.nbytes)  # room for three chunks of one namespace
    for i, keys in enumerate((["a"], ["a", "b"], ["a", "b", "c"])):
        assert s.put("ns", keys, stored(i), CONTEXT)
    assert s.evictions == 0
    assert s.get("ns", ["a", "b"]) is not None  # the path to b touched: c is the oldest now
    assert s.put("ns", ["a", "x"], stored(7), CONTEXT)  # a fourth: one goes, the least recently used leaf
    assert s.evictions == 1 and s.nbytes <= s.max_bytes
    assert s.get("ns", ["a", "b", "c"]) is None and s.get("ns", ["a", "x"]) is not None
    assert s.get("ns", ["a", "b"]) is not None
    # A second namespace: the first one's oldest leaves go, never a node a kept one needs.
    assert s.put("ns2", ["q"], stored(8), CONTEXT)
    assert s.nbytes <= s.max_bytes and s.evictions == 3
    assert s.get("ns2", ["q"]) is not None
    held = [keys for keys in (["a"], ["a", "b"], ["a", "x"]) if s.get("ns", keys) is not None]
    assert held == [["a"]] or held == [], held  # what is left of ns is a prefix, reachable
    # A chunk over the whole budget is never stored.
    assert not s.put("ns3", ["z"], stored(9, video_bytes=s.max_bytes), CONTEXT)
    assert s.get("ns3", ["z"]) is None and s.nbytes <= s.max_bytes


def test_a_namespace_whose_chunks_are_all_evicted_goes_with_them():
    one = stored(0).nbytes
    s = PrefixStore(one + CONTEXT.nbytes)
    assert s.put("ns", ["a"], stored(0), CONTEXT)
    assert s.put("ns2", ["a"], stored(1), CONTEXT)
    assert s.context("ns") is None and s.get("ns", ["a"]) is None
    assert s.nbytes == one + CONTEXT.nbytes and len(s) == 2


def test_the_cursor_truncated_computes_from_then_on():
    c = PrefixCursor("ns", ["a", "b", "c"])
    t = c.truncated(1)
    assert (t.namespace, t.keys, t.serving) == ("ns", ["a"], False) and c.keys == ["a", "b", "c"]


def test_the_scope_is_the_api_key_else_the_address_else_the_connection():
    assert scope_of("principal", "k1", "10.0.0.1", "c1") == "key:k1" != scope_of("principal", "k2", "10.0.0.1", "c1")
    assert scope_of("principal", None, "10.0.0.1", "c1") == scope_of("principal", None, "10.0.0.1", "c2")
    assert scope_of("principal", None, "10.0.0.1", "c1") != scope_of("principal", None, "10.0.0.2", "c1")
    for unknown in (None, "", UNKNOWN_CLIENT):  # no address: shared with no other connection
        assert scope_of("principal", None, unknown, "c1") != scope_of("principal", None, unknown, "c2")
    assert scope_of("global", "k1", "10.0.0.1", "c1") == scope_of("global", None, None, "c2") == "global"


def test_prefix_cache_config():
    assert not AppArgs().prefix_cache.enabled and AppArgs().prefix_cache.scope == "principal"
    on = AppArgs.model_validate({"prefix_cache": {"max_mib": 64, "scope": "global"}})
    assert on.prefix_cache.enabled and on.prefix_cache.scope == "global"
    assert AppArgs.model_validate({"prefix_cache": {"snapshot_mib": 64}}).prefix_cache.snapshot_mib == 64
    with pytest.raises(ValidationError):
        AppArgs.model_validate({"prefix_cache": {"snapshot_mib": -1}})
    with pytest.raises(ValidationError, match="prefix_cache needs sessions.recovery"):
        AppArgs.model_validate({"prefix_cache": {"max_mib": 64}, "sessions": {"recovery": False}})
    with pytest.raises(ValidationError):
        AppArgs.model_validate({"prefix_cache": {"max_mib": 64, "scope": "everyone"}})
