"""Where a start's time went: `serve run` -> healthy, split by replica and phase (issue 35.1).

Each replica reports its ready split in its stats (`ready`, model/ready.py: load, warm-up per
size with torch.compile's share, compile-cache save, total, Unix start and end times, compile
cache hits). This reads them from `/v1/models` (a saved response, or a running server) and
places them on the time line of the `serve run` that started them:

    python -m benchmarks.ready_split --models models_start.json --launched-at 1764921234.5 \\
        --healthy-s 143.4 --label cold --out ready_cold.json
    python -m benchmarks.ready_split --combine ready_cold.json ready_warm.json --out ready.json

Per start: `healthy_s` (launch -> /healthz 200), `ray_start_s` (launch -> the first replica's
constructor: Ray, the controller, scheduling), `replicas_ready_s` (launch -> the last replica
ready), `after_replicas_s` (the rest: the ingress, the proxy, the health check's period), and per
replica its phases and `start_after_launch_s` / `ready_after_launch_s` (and, where the replicas
keep compile artefacts in the world store, its `compile_store`: fetched, bytes loaded, put).
`--combine` gathers starts (a cold one and a warm one from `RESTART=1 bash benchmarks/gpu_serve.sh`,
a start from the store's artefacts from `STORE_WARM=1`) in one file.
"""
from __future__ import annotations

import argparse
import json
import urllib.request
from pathlib import Path
from typing import Any, Optional

DEPLOYMENTS = ("text_encoder", "vae", "dit")
PHASES = ("store_fetch_s", "load_s", "warmup_s", "cache_save_s", "store_put_s", "probe_s", "compile_s", "total_s")


def replicas_of(models: dict) -> dict[str, list[dict]]:
    """The replicas' stats of a /v1/models response, by deployment."""
    (model,) = models["data"]
    return model["replicas"]


def split(models: dict, launched_at: Optional[float], healthy_s: Optional[float], label: str) -> dict[str, Any]:
    """One start's record (see the module docstring); offsets need `launched_at`."""
    out: dict[str, Any] = {"label": label, "healthy_s": healthy_s, "launched_at": launched_at, "replicas": {}}
    starts, ends = [], []
    for name, replicas in replicas_of(models).items():
        rows = []
        for stats in replicas:
            ready = stats.get("ready")
            if ready is None:
                continue
            row = {"replica": stats.get("replica"), **{k: ready[k] for k in PHASES if k in ready},
                   "warmup_per_size": ready.get("warmup_per_size", []),
                   "compile_cache": ready.get("compile_cache")}
            if "compile_store" in ready:  # the world store's compile artefacts (STORE_WARM=1 in gpu_serve.sh)
                row["compile_store"] = ready["compile_store"]
            if launched_at is not None:
                row["start_after_launch_s"] = round(ready["started_at"] - launched_at, 3)
                row["ready_after_launch_s"] = round(ready["ready_at"] - launched_at, 3)
            starts.append(ready["started_at"])
            ends.append(ready["ready_at"])
            rows.append(row)
        out["replicas"][name] = rows
    if launched_at is not None and starts:
        out["ray_start_s"] = round(min(starts) - launched_at, 3)
        out["replicas_ready_s"] = round(max(ends) - launched_at, 3)
        if healthy_s is not None:
            out["after_replicas_s"] = round(healthy_s - out["replicas_ready_s"], 3)
    return out


def combine(records: list[dict]) -> dict[str, Any]:
    """Several starts in one document, with each start's time to healthy by label."""
    return {"starts": records, "healthy_s": {r["label"]: r["healthy_s"] for r in records}}


def describe(record: dict) -> str:
    lines = [f"{record['label']}: healthy {record['healthy_s']} s after launch; Ray start "
             f"{record.get('ray_start_s')} s, last replica ready {record.get('replicas_ready_s')} s"]
    for name, rows in record["replicas"].items():
        for row in rows:
            sizes = " ".join(f"{e['size'][0]}x{e['size'][1]} {e['seconds']:.1f}s (compile {e['compile_s']:.1f})"
                             for e in row["warmup_per_size"])
            cache = row.get("compile_cache") or {}
            hits = f"fxgraph hit/miss {cache.get('fxgraph_cache_hit')}/{cache.get('fxgraph_cache_miss')}" if cache else ""
            store = row.get("compile_store")
            if store:
                hits += (f", store {store['fetched']} {store['loaded_bytes']} B in {row.get('store_fetch_s')} s, "
                         f"{store['published']} {store['put_bytes']} B")
            lines.append(f"  {name}: load {row.get('load_s')} s, warm-up {row.get('warmup_s')} s [{sizes}], "
                         f"total {row.get('total_s')} s {hits}")
    return "\n".join(lines)


def fetch_models(url: str) -> dict:
    with urllib.request.urlopen(f"{url.rstrip('/')}/v1/models", timeout=30) as r:
        return json.loads(r.read())


def main(argv: Optional[list[str]] = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", type=Path, help="a saved /v1/models response (else --url)")
    p.add_argument("--url", default="http://127.0.0.1:8000")
    p.add_argument("--launched-at", type=float, default=None, help="Unix time `serve run` was launched")
    p.add_argument("--healthy-s", type=float, default=None, help="launch -> /healthz 200, seconds")
    p.add_argument("--label", default="start")
    p.add_argument("--combine", type=Path, nargs="+", help="records of earlier calls to gather in one file")
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args(argv)
    if args.combine:
        doc = combine([json.loads(f.read_text()) for f in args.combine])
        print(json.dumps(doc["healthy_s"]))
    else:
        models = json.loads(args.models.read_text()) if args.models else fetch_models(args.url)
        doc = split(models, args.launched_at, args.healthy_s, args.label)
        print(describe(doc))
    args.out.write_text(json.dumps(doc, indent=2))


if __name__ == "__main__":
    main()
