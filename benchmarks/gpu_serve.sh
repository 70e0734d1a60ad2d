#!/usr/bin/env bash
# The served graph on one H200, measured under load (issue 13, item 7). Run from the repo root:
#
#   bash benchmarks/gpu_serve.sh          # the device tool: carry [".whl"], kind nvidia-h200, timeout 600
#
# 1. unpacks the wheels the image lacks (ray 2.60 cp312 and grpcio-reflection matching the image's
#    grpcio 1.84.0, fastapi, starlette, uvicorn, h11, websockets, pydantic + pydantic-core,
#    annotated-types, typing-inspection, av, msgpack-numpy, ftfy + wcwidth, watchfiles (ray.serve.scripts
#    imports it), jsonschema + referencing + rpds-py + jsonschema-specifications (import ray),
#    protobuf >= 7.35.1 (grpcio-reflection 1.84), opentelemetry-api (fastapi 0.165), and their
#    (the stripped ray wheel, 41 MiB, travels alone in a first call: install_wheels.py .whlray)
#    remaining
#    dependencies: VERIFIED_NOTES.md) from .whl/ into /tmp/site (benchmarks/install_wheels.py);
#    SKIP_WHEELS=1 where they are installed. The imports are checked before anything starts;
# 2. `serve run benchmarks/serve_config.h200.yaml`: the shipped GPU config with random full-size
#    weights; every replica compiles and warms up the three size buckets in its constructor;
# 3. waits for /healthz (time to healthy = Ray start + building the models + warm-up);
# 4. benchmarks.serve_load with 1 session, 1 more (TTFC of a session after the first), 2, 3 and
#    4 concurrent full-attention sessions of 81 frames (admission decides how many are served:
#    the rest get `busy`), one run after the other, until the time budget is spent;
#    OPEN_ENDED=1 declares no num_frames (open-ended sessions: the config's rolling window);
#    SESSIONS_OPEN="3 6" adds a pass of open-ended sessions of FRAMES_OPEN (129) frames after it;
#    BRANCH=1 then benchmarks.branch_bench (prefix hit, fork, rewind: branch_bench.json) and
#    DRIVE=1 benchmarks.serve_load --drive (serve_load_drive.json), AUTOSCALE=1 benchmarks.autoscale_ready
#    (autoscale.json; an autoscaled CONFIG such as serve_config.h200.autoscale_fp8.yaml), each bounded by the budget left
#    (BRANCH_CHUNKS: the branch bench's session length, default 20; DRIVE_ARGS: e.g. "--presses 4");
#    LINE=1 benchmarks.line.scenarios (issue 46: the line, live before jobs, fairness: line_bench.json; LINE_ARGS)
#    and ARRIVALS="RATE_PER_MIN DURATION_S" serve_load --arrival-rate (arrivals.json; ARRIVAL_ARGS);
#    last, RESUME_DRILL=1 benchmarks/resume_drill.py (a session dropped and resumed, the prefix store
#    off and on: resume_drill.json) and RECOVERY_DRILL=1 its --kill-app (the DiT replica killed
#    mid-session and restarted: recovery_drill.json; APP_NAME);
#    SESSIONS="" skips the load runs; unset, the default "1 1 2 3 4" keeps only the counts the
#    config has seats for (benchmarks.line.seats: sessions.max_sessions x DiT replicas; "1 1" on
#    serve_config.gpu.yaml's one seat: more sessions than seats would wait in the server's line and
#    eat the hooks' budget).
#    Every client waits in the server's line when told `queued` and records the wait (queued_s);
#    a part that needs two seats at once (branch_bench's fork and fork below the head) is skipped
#    on one seat and says so in its JSON; each hook resets its sessions, also when it fails or its
#    `timeout` ends it (SIGTERM), so no session parked for the resume grace holds the next hook's seat;
# 5. stops Serve (SIGTERM; its local Ray goes with it) and leaves in $OUT: serve_load.{json,txt,png} (the png only when
#    matplotlib is there; else `python -m benchmarks.serve_load --plot-from serve_load.json`),
#    models_start.json (replica stats after warm-up), gpu_mem.csv (nvidia-smi every 2 s),
#    time_to_healthy_s, serve_run.log and the Serve replica logs (serve_logs.tar.gz).
#
# Compile cache and ready split (issue 35): the cold start first empties the config's
# model.compile_cache_dir and torch's default caches (KEEP_COMPILE_CACHE=1 keeps them). Each
# start's split (Ray start, per replica load / compile / warm-up per size, cache hits) goes to
# ready_cold.json (benchmarks/ready_split.py, from /v1/models). RESTART=1: after the cold start
# is healthy, Serve is stopped (its process group) and `serve run` starts again with the cache
# the first start filled: time_to_healthy_warm_s, models_warm.json, ready_warm.json,
# serve_run_warm.log, serve_logs_cold.tar.gz; the load runs then measure the warm-started
# server. ready.json holds both starts ({"healthy_s": {"cold": .., "warm": ..}, "starts": [..]}).
#
# STORE_WARM=1 (issue 55 item 5: a replica's cold start with the store's compile artefacts): the
# config gets a world store in a local folder on this machine (`worlds: {backend: local, root:
# $STORE_ROOT, compile_artifacts: true}`; STORE_ROOT default /tmp/lwf-store-warm, emptied before the
# first start), so the cold start's replicas put their compile artefacts there after warm-up. After
# it (and after RESTART's warm start, when both are asked for) Serve is stopped, the local compile
# caches are emptied again (the config's model.compile_cache_dir and torch's defaults: a fresh
# node) with the store kept, and `serve run` starts once more: time_to_healthy_store_s,
# models_store.json, ready_store.json (each replica's `compile_store`: what it fetched and
# loaded), serve_run_store.log; ready.json's "store" entry. SESSIONS="" skips the load runs.
#
# Worlds and sharing (issues 55 and 56; tested on the CPU: tests/deployments/test_world_benchmarks.py):
# WORLD_OPEN=1 and RESTART_DRILL=1 turn the config's world store on in a local folder (`worlds:
# {enabled: true, backend: local, root: $WORLDS_ROOT}`, default $TMPDIR/lwf-worlds-bench (/tmp without TMPDIR), emptied before
# the start; with STORE_WARM=1 its store, $STORE_ROOT). WORLD_OPEN=1: benchmarks/worlds/open_replay.py
# --open-ended --open $WORLD_OPEN_CHUNKS (default 50): one session of 51 chunks saved after chunk 50,
# the world opened on a new socket, open -> its first new chunk timed (issue 55's target <= 15 s on
# the FP8 window config) and the chunk's bytes against the session's; then the same 51 chunks
# replayed from the inputs (world_open.json, written before the replay too; WORLD_OPEN_ARGS).
# WATCH_LOAD=1: benchmarks/sharing/watch_load.py with $WATCH_VIEWERS (default 100) viewers of one
# owner's world, runs of 0 viewers before and after (watch_load_gpu.json; WATCH_CHUNKS, default 10;
# OPEN_ENDED=1 passes --open-ended); the config's viewer limits (sharing.max_viewers,
# max_views_per_principal, joins_per_minute), connection.max_connections_per_client and the
# ingress's max_ongoing_requests are raised to fit them (all come from one address here).
# RESTART_DRILL=1, last of all: benchmarks/worlds/restart_drill.py --phase start ($RESTART_SESSIONS
# sessions, default 2, fewer where the config has fewer seats; each
# first played uninterrupted for $RESTART_CHUNKS (5) chunks as the reference, then both live at once
# for $RESTART_BEFORE (2) chunks and left without a reset once the store has them), Serve stopped
# and `serve run` started again with the compile cache kept (time_to_healthy_restart_s,
# serve_run_restart.log; serve_logs_before_restart.tar.gz), then --phase resume: each session
# resumes with its token on the new app and plays to the end: restart_drill.json (identical chunks
# of all, time to healthy, stop -> both resumed). Each hook is bounded by the budget left (the
# restart's health wait too) and skipped, saying so, when too little is left. On one H100 (a cold
# start ~150 s, a warm one ~85 s) the three do not fit one call's 540 s: `WORLD_OPEN=1 WATCH_LOAD=1`
# in one, `RESTART_DRILL=1 KEEP_COMPILE_CACHE=1` in the next on the warm machine (its cache kept).
# Run on the CPU (SKIP_WHEELS=1 KEEP_COMPILE_CACHE=1 CONFIG=serve_config.yaml, small counts) every
# hook completed: docs/PERFORMANCE.md round 7.
#
# Wall-time budget (BUDGET_S, default 540 s of the device tool's 600): wheels ~30 s, Ray + models
# + warm-up ~2-3 min (waits at most HEALTH_WAIT_S), the load runs ~2 min (no run starts later than
# the budget minus 60 s), shutdown ~20 s. Frames: 81 per session (7 chunks), the engine
# benchmark's length, so the numbers compare with docs/PERFORMANCE.md.
set -u -o pipefail

START=$(date +%s)
BUDGET_S=${BUDGET_S:-540}
HEALTH_WAIT_S=${HEALTH_WAIT_S:-330}
SESSIONS_SET=${SESSIONS+set}
SESSIONS=${SESSIONS-"1 1 2 3 4"}
FRAMES=${FRAMES:-81}
CONFIG=${CONFIG:-benchmarks/serve_config.h200.yaml}
PY=${PYTHON:-python3}
SITE=${SITE:-/tmp/site}
OUT=${OUT:-$PWD/out/gpu_serve}
mkdir -p "$OUT"
elapsed() { echo $(( $(date +%s) - START )); }
log() { echo "[$(elapsed)s] $*" | tee -a "$OUT/gpu_serve.log"; }

if [ "${SKIP_WHEELS:-0}" = 1 ]; then
    log "SKIP_WHEELS=1: using the installed packages"
else
    log "installing wheels from .whl into $SITE"
    if ! $PY benchmarks/install_wheels.py .whl "$SITE" > "$OUT/install.log" 2>&1; then
        log "wheel install failed"; tail -20 "$OUT/install.log"; exit 1
    fi
fi
export PYTHONPATH="$SITE:$PWD"
# FA4's CUTLASS DSL keeps its modules in a folder its .pth file adds, which a PYTHONPATH entry never runs
if [ -d "$SITE/nvidia_cutlass_dsl/dsl_packages" ]; then PYTHONPATH="$PYTHONPATH:$SITE/nvidia_cutlass_dsl/dsl_packages"; fi
export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
# the proxy guard (deployments/proxy_guard.py), as the k8s manifests and scripts/setup.sh's venv have it
export RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH=${RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH:-deployments.proxy_guard:middlewares}
export RAY_SERVE_LOG_TO_STDERR=0
export PYTHONUNBUFFERED=1  # a benchmark cut by its timeout still leaves what it printed
if ! $PY -c "import ray, ray.serve, fastapi, uvicorn, websockets, av, msgpack_numpy, pydantic, ftfy, torch, yaml, scipy, PIL
print('ray', ray.__version__, 'torch', torch.__version__, 'cuda', torch.cuda.is_available())" >> "$OUT/gpu_serve.log" 2>&1; then
    log "imports failed"; tail -20 "$OUT/gpu_serve.log"; exit 1
fi
nvidia-smi > "$OUT/nvidia-smi.txt" 2>&1 || true
nvidia-smi --query-gpu=timestamp,memory.used,memory.total,utilization.gpu --format=csv -l 2 \
    > "$OUT/gpu_mem.csv" 2>/dev/null &
SMI_PID=$!

# An overlay config (`base:` + the args it changes: benchmarks/overlay.py) is resolved to a plain one first.
if grep -q '^base:' "$CONFIG"; then
    $PY -m benchmarks.overlay "$CONFIG" "$OUT/serve_config.yaml" || { log "overlay $CONFIG did not resolve"; exit 1; }
    log "overlay $CONFIG -> $OUT/serve_config.yaml"
    CONFIG="$OUT/serve_config.yaml"
fi
# the seats: sessions.max_sessions x the DiT's replicas at start (its min_replicas when it autoscales)
if [ -z "$SESSIONS_SET" ] && FITS=$($PY -m benchmarks.line.seats "$CONFIG" --fit $SESSIONS 2>> "$OUT/gpu_serve.log"); then
    SESSIONS=$FITS
    log "$($PY -m benchmarks.line.seats "$CONFIG") seat(s) in $CONFIG: serve_load sessions \"$SESSIONS\" (SESSIONS=... to choose)"
fi
if [ "${STORE_WARM:-0}" = 1 ]; then  # the replicas' compile artefacts in a world store (a local folder here)
    STORE_ROOT=${STORE_ROOT:-/tmp/lwf-store-warm}
    rm -rf "$STORE_ROOT"
    $PY -c "
import sys, yaml
c = yaml.safe_load(open(sys.argv[1]))
c['applications'][0]['args']['worlds'] = {'backend': 'local', 'root': sys.argv[2], 'compile_artifacts': True}
yaml.safe_dump(c, open(sys.argv[3], 'w'), sort_keys=False)" "$CONFIG" "$STORE_ROOT" "$OUT/serve_config.store.yaml" \
        || { log "STORE_WARM=1: could not add the store to $CONFIG"; exit 1; }
    CONFIG="$OUT/serve_config.store.yaml"
    log "STORE_WARM=1: compile artefacts kept in the world store at $STORE_ROOT ($CONFIG)"
fi
patch_config() {  # patch_config NAME JSON: the config's args with JSON merged in (benchmarks/overlay.py's merge)
    $PY -c "
import json, sys, yaml
from benchmarks.overlay import merge
c = yaml.safe_load(open(sys.argv[1]))
c['applications'][0]['args'] = merge(c['applications'][0]['args'], json.loads(sys.argv[2]))
yaml.safe_dump(c, open(sys.argv[3], 'w'), sort_keys=False)" "$CONFIG" "$2" "$OUT/serve_config.$1.yaml" \
        || { log "could not patch $CONFIG for $1"; exit 1; }
    CONFIG="$OUT/serve_config.$1.yaml"
}
if [ "${WORLD_OPEN:-0}" = 1 ] || [ "${RESTART_DRILL:-0}" = 1 ]; then  # issue 55: sessions kept in a world store
    if [ "${STORE_WARM:-0}" = 1 ]; then
        patch_config worlds '{"worlds": {"enabled": true}}'
    else
        WORLDS_ROOT=${WORLDS_ROOT:-${TMPDIR:-/tmp}/lwf-worlds-bench}
        rm -rf "$WORLDS_ROOT"
        patch_config worlds "{\"worlds\": {\"enabled\": true, \"backend\": \"local\", \"root\": \"$WORLDS_ROOT\"}}"
    fi
    log "WORLD_OPEN / RESTART_DRILL: the world store on ($CONFIG)"
fi
if [ "${WATCH_LOAD:-0}" = 1 ]; then  # issue 56: room for the viewers, all from this machine's address
    WATCH_VIEWERS=${WATCH_VIEWERS:-100}
    ONGOING=$(( WATCH_VIEWERS + 32 > 256 ? WATCH_VIEWERS + 32 : 256 ))
    patch_config watch "{\"sharing\": {\"max_viewers\": $(( WATCH_VIEWERS + 8 )), \"max_views_per_principal\": $(( WATCH_VIEWERS + 8 )), \"joins_per_minute\": 100000}, \"connection\": {\"max_connections_per_client\": $(( WATCH_VIEWERS + 16 ))}, \"ingress\": {\"max_ongoing_requests\": $ONGOING}}"
    log "WATCH_LOAD=1: room for $WATCH_VIEWERS viewers ($CONFIG)"
fi
CACHE_DIR=$($PY -c "import sys, yaml; c = yaml.safe_load(open(sys.argv[1])); print(c['applications'][0]['args'].get('model', {}).get('compile_cache_dir') or '')" "$CONFIG")
empty_compile_caches() {  # the config's compile_cache_dir and torch's default caches (a fresh node's)
    [ -n "$CACHE_DIR" ] && rm -rf "$CACHE_DIR"
    rm -rf "/tmp/torchinductor_$(id -un 2>/dev/null)" "${HOME:-/root}/.triton/cache"
}
if [ "${KEEP_COMPILE_CACHE:-0}" = 1 ]; then
    log "KEEP_COMPILE_CACHE=1: the compile caches stay (${CACHE_DIR:-the torch defaults})"
else
    log "cold start: emptying the compile caches (${CACHE_DIR:-no compile_cache_dir}, and the torch defaults)"
    empty_compile_caches
fi

SERVE_PID=
start_serve() {  # start_serve SUFFIX: serve run, then wait for /healthz
    local suffix=$1
    log "serve run $CONFIG${suffix:+ ($suffix)}"
    LAUNCHED_AT=$(date +%s.%N)
    # its own process group (PGID = its PID), so that stop_serve can end what is left of it
    $PY -c "import os; os.setpgrp(); from ray.serve.scripts import cli; cli()" run "$CONFIG" \
        > "$OUT/serve_run$suffix.log" 2>&1 &
    SERVE_PID=$!
    log "waiting for /healthz (at most ${HEALTH_WAIT_S}s)"
    if ! $PY - "$HEALTH_WAIT_S" "$SERVE_PID" "$LAUNCHED_AT" > "$OUT/time_to_healthy$suffix""_s" 2>> "$OUT/gpu_serve.log" <<'PYEOF'
import os, sys, time, urllib.request
limit, pid, t0 = float(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])  # t0: the launch
while time.time() - t0 < limit:
    try:
        os.kill(pid, 0)
    except OSError:
        sys.exit("serve run exited")
    try:
        with urllib.request.urlopen("http://127.0.0.1:8000/healthz", timeout=5) as r:
            if r.status == 200:
                print(f"{time.time() - t0:.1f}")
                sys.exit(0)
    except Exception:
        pass
    time.sleep(1)
sys.exit("not healthy in time")
PYEOF
    then
        log "the server did not become healthy"; tail -40 "$OUT/serve_run$suffix.log"; exit 1
    fi
    log "healthy $(cat "$OUT/time_to_healthy$suffix""_s") s after serve run"
    SESSION_DIR=$(readlink -f /tmp/ray/session_latest 2>/dev/null)  # the Ray started by this serve run
}

stop_serve() {  # stop_serve LOGS_NAME: SIGTERM, then what is left of its process group
    [ -z "$SERVE_PID" ] && return
    log "stopping Serve (SIGTERM to $SERVE_PID)"
    kill -TERM "$SERVE_PID" 2>/dev/null
    for _ in $(seq 1 30); do kill -0 "$SERVE_PID" 2>/dev/null || break; sleep 1; done
    kill -KILL "$SERVE_PID" 2>/dev/null  # its local Ray instance goes with it (no `ray stop`: it
                                          # would end every Ray on the machine)
    kill -KILL -- "-$SERVE_PID" 2>/dev/null  # anything of its process group still there
    SERVE_PID=
    [ -n "${SESSION_DIR:-}" ] && [ -d "$SESSION_DIR/logs/serve" ] && \
        tar czf "$OUT/$1" -C "$SESSION_DIR/logs/serve" . 2>/dev/null
}

stop_all() {
    stop_serve serve_logs.tar.gz
    kill "$SMI_PID" 2>/dev/null
    log "done"
}
trap stop_all EXIT

models_and_split() {  # models_and_split MODELS_FILE LABEL SUFFIX: /v1/models and the ready split
    $PY -c "import urllib.request; print(urllib.request.urlopen('http://127.0.0.1:8000/v1/models', timeout=30).read().decode())" \
        > "$OUT/$1" 2>> "$OUT/gpu_serve.log"
    $PY -m benchmarks.ready_split --models "$OUT/$1" --launched-at "$LAUNCHED_AT" \
        --healthy-s "$(cat "$OUT/time_to_healthy$3""_s")" --label "$2" --out "$OUT/ready_$2.json" 2>&1 | tee -a "$OUT/gpu_serve.log"
}

wait_gpu_memory() {  # the last start's GPU memory back before the next allocates
    for _ in $(seq 1 60); do
        used=$(nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits 2>/dev/null | head -1)
        [ -z "$used" ] || [ "$used" -lt 2048 ] && break
        sleep 1
    done
}

start_serve ""
models_and_split models_start.json cold ""
READY_FILES=("$OUT/ready_cold.json")
LAST=cold
if [ "${RESTART:-0}" = 1 ]; then  # issue 35.1: the same config again, its compile cache filled
    stop_serve serve_logs_cold.tar.gz
    wait_gpu_memory
    log "restart with the compile cache (${CACHE_DIR:-the torch defaults}; GPU memory used ${used:-?} MiB)"
    start_serve _warm
    models_and_split models_warm.json warm _warm
    READY_FILES+=("$OUT/ready_warm.json")
    LAST=warm
fi
if [ "${STORE_WARM:-0}" = 1 ]; then  # issue 55.5: a fresh node: empty local caches, the store's artefacts
    stop_serve "serve_logs_$LAST.tar.gz"
    wait_gpu_memory
    empty_compile_caches
    log "start with the store's compile artefacts ($(find "$STORE_ROOT" -type f | wc -l) files, $(du -sh "$STORE_ROOT" | cut -f1) in $STORE_ROOT), the local compile caches emptied (GPU memory used ${used:-?} MiB)"
    start_serve _store
    models_and_split models_store.json store _store
    READY_FILES+=("$OUT/ready_store.json")
fi
$PY -m benchmarks.ready_split --combine "${READY_FILES[@]}" --out "$OUT/ready.json" 2>&1 | tee -a "$OUT/gpu_serve.log"

DEADLINE=$(( BUDGET_S - 60 - $(elapsed) ))
if [ -n "$SESSIONS" ]; then
    log "serve_load: sessions $SESSIONS, $FRAMES frames, no run starts after ${DEADLINE}s"
    $PY -m benchmarks.serve_load --url ws://127.0.0.1:8000/v1/realtime/world/camera \
        --sessions $SESSIONS --frames "$FRAMES" --deadline-s "$DEADLINE" --reply-timeout-s 120 \
        $([ "${OPEN_ENDED:-0}" = 1 ] && echo --open-ended) \
        --out "$OUT/serve_load.json" 2>&1 | tee -a "$OUT/gpu_serve.log"
fi
if [ -n "${SESSIONS_OPEN:-}" ]; then  # then open-ended sessions (the config's window) on the same server
    log "serve_load open-ended: sessions $SESSIONS_OPEN, ${FRAMES_OPEN:-129} frames"
    $PY -m benchmarks.serve_load --url ws://127.0.0.1:8000/v1/realtime/world/camera --open-ended \
        --sessions $SESSIONS_OPEN --frames "${FRAMES_OPEN:-129}" --deadline-s $(( BUDGET_S - 90 - $(elapsed) )) \
        --reply-timeout-s 120 --out "$OUT/serve_load_open.json" 2>&1 | tee -a "$OUT/gpu_serve.log"
fi
left() { echo $(( BUDGET_S - 30 - $(elapsed) )); }  # seconds a hook may still take
if [ "${BRANCH:-0}" = 1 ]; then  # issue 33: prefix hit, fork at the last chunk, rewind
    if [ "$(left)" -gt 10 ]; then
        log "branch_bench (at most $(left) s)"
        timeout "$(left)" $PY -m benchmarks.branch_bench --chunks "${BRANCH_CHUNKS:-20}" --out "$OUT/branch_bench.json" 2>&1 \
            | tee -a "$OUT/gpu_serve.log"
    else
        log "branch_bench skipped: no budget left"
    fi
fi
if [ "${AUTOSCALE:-0}" = 1 ]; then  # issue 35.1: a DiT replica the autoscaler starts (an autoscaled config)
    if [ "$(left)" -gt 10 ]; then
        log "autoscale_ready (at most $(left) s)"
        timeout "$(left)" $PY -m benchmarks.autoscale_ready --out "$OUT/autoscale.json" 2>&1 | tee -a "$OUT/gpu_serve.log"
        # the replicas' states as Serve sees them (a replica pending for resources, or failing to start)
        # (the Python API: `serve status` asks the dashboard for a token)
        timeout 60 $PY -c "
import ray; from ray import serve
ray.init(address='auto', logging_level='ERROR')
for app, a in serve.status().applications.items():
    for name, d in a.deployments.items():
        print(app, name, d.status, dict(d.replica_states), d.message or '')" > "$OUT/serve_status.txt" 2>&1
    else
        log "autoscale_ready skipped: no budget left"
    fi
fi
if [ "${LINE:-0}" = 1 ]; then  # issue 46: the waiting room, live before jobs, fairness (benchmarks.line.scenarios.py)
    if [ "$(left)" -gt 10 ]; then
        log "line_bench (at most $(left) s)"
        timeout "$(left)" $PY -m benchmarks.line.scenarios ${LINE_ARGS:-} --out "$OUT/line_bench.json" 2>&1 \
            | tee -a "$OUT/gpu_serve.log"
    else
        log "line_bench skipped: no budget left"
    fi
fi
if [ -n "${ARRIVALS:-}" ]; then  # issue 46: Poisson arrivals ("RATE_PER_MIN DURATION_S"), waits and the line
    read -r RATE DURATION <<< "$ARRIVALS"
    if [ "$(left)" -gt 10 ]; then
        log "serve_load --arrival-rate $RATE --duration-s $DURATION (at most $(left) s)"
        timeout "$(left)" $PY -m benchmarks.serve_load --arrival-rate "$RATE" --duration-s "$DURATION" \
            --frames "$FRAMES" ${ARRIVAL_ARGS:-} --out "$OUT/arrivals.json" 2>&1 | tee -a "$OUT/gpu_serve.log"
    else
        log "arrivals skipped: no budget left"
    fi
fi
if [ "${DRIVE:-0}" = 1 ]; then  # serve_load's driven sessions
    if [ "$(left)" -gt 10 ]; then
        log "serve_load --drive (at most $(left) s)"
        timeout "$(left)" $PY -m benchmarks.serve_load --drive ${DRIVE_ARGS:-} --out "$OUT/serve_load_drive.json" 2>&1 \
            | tee -a "$OUT/gpu_serve.log"
    else
        log "serve_load --drive skipped: no budget left"
    fi
fi
if [ "${RESUME_DRILL:-0}" = 1 ]; then  # issues 15.3, 44.3 (benchmarks/resume_drill.py): dropped and resumed, store off and on
    if [ "$(left)" -gt 10 ]; then  # (`timeout 0` would mean no limit)
        log "resume drill (at most $(left) s)"
        timeout "$(left)" $PY -m benchmarks.resume_drill --url ws://127.0.0.1:8000/v1/realtime/world/camera --frames 57 \
            --out "$OUT/resume_drill.json" 2>&1 | tee -a "$OUT/gpu_serve.log"
    else
        log "resume drill skipped: no budget left"
    fi
fi
if [ "${RECOVERY_DRILL:-0}" = 1 ]; then  # issue 44.3: the DiT replica killed mid-session; last: its restart
    if [ "$(left)" -gt 10 ]; then  # must not touch the other hooks' numbers
        log "recovery drill (at most $(left) s)"
        timeout "$(left)" $PY -m benchmarks.resume_drill --url ws://127.0.0.1:8000/v1/realtime/world/camera --frames 57 \
            --stores --kill-app "${APP_NAME:-lingbot-world}" --out "$OUT/recovery_drill.json" 2>&1 | tee -a "$OUT/gpu_serve.log"
    else
        log "recovery drill skipped: no budget left"
    fi
fi
if [ "${WORLD_OPEN:-0}" = 1 ]; then  # issue 55: a saved world of WORLD_OPEN_CHUNKS opened, against its replay
    if [ "$(left)" -gt 10 ]; then
        log "world open (at most $(left) s)"
        timeout "$(left)" $PY -m benchmarks.worlds.open_replay --url ws://127.0.0.1:8000/v1/realtime/world/camera \
            --open-ended --open "${WORLD_OPEN_CHUNKS:-50}" ${WORLD_OPEN_ARGS:-} --out "$OUT/world_open.json" 2>&1 \
            | tee -a "$OUT/gpu_serve.log"
    else
        log "world open skipped: no budget left"
    fi
fi
if [ "${WATCH_LOAD:-0}" = 1 ]; then  # issue 56: one owner, WATCH_VIEWERS viewers, 0-viewer runs around them
    if [ "$(left)" -gt 10 ]; then
        log "watch_load: $WATCH_VIEWERS viewers (at most $(left) s)"
        timeout "$(left)" $PY -m benchmarks.sharing.watch_load --url ws://127.0.0.1:8000/v1/realtime/world/camera \
            --viewers "$WATCH_VIEWERS" --chunks "${WATCH_CHUNKS:-10}" --app "${APP_NAME:-lingbot-world}" --server-pid "$SERVE_PID" \
            $([ "${OPEN_ENDED:-0}" = 1 ] && echo --open-ended) --out "$OUT/watch_load_gpu.json" 2>&1 | tee -a "$OUT/gpu_serve.log"
    else
        log "watch_load skipped: no budget left"
    fi
fi
if [ "${RESTART_DRILL:-0}" = 1 ]; then  # issue 55: two live sessions across `serve run` again; last: it restarts Serve
    RESTART_SESSIONS=${RESTART_SESSIONS:-2}  # live at once, at most the seats: one more would wait in line for a seat nobody frees
    SEATS=$($PY -m benchmarks.line.seats "$CONFIG" 2>/dev/null || echo "$RESTART_SESSIONS")
    if [ "$SEATS" -lt "$RESTART_SESSIONS" ]; then
        log "restart drill: $SEATS seat(s) in $CONFIG: $SEATS live session(s), not $RESTART_SESSIONS"
        RESTART_SESSIONS=$SEATS
    fi
    if [ "$(left)" -gt 150 ]; then
        DRILL=(--url ws://127.0.0.1:8000/v1/realtime/world/camera --state "$OUT/restart_state.json" --sessions "$RESTART_SESSIONS"
               --chunks "${RESTART_CHUNKS:-5}" --before "${RESTART_BEFORE:-2}" $([ "${OPEN_ENDED:-0}" = 1 ] && echo --open-ended))
        log "restart drill: two sessions live (at most $(( $(left) - 120 )) s)"
        if timeout "$(( $(left) - 120 ))" $PY -m benchmarks.worlds.restart_drill --phase start "${DRILL[@]}" \
                >> "$OUT/gpu_serve.log" 2>&1; then
            STOPPED_AT=$(date +%s.%N)
            stop_serve serve_logs_before_restart.tar.gz
            wait_gpu_memory
            HEALTH_WAIT_S=$(( $(left) - 40 < HEALTH_WAIT_S ? $(left) - 40 : HEALTH_WAIT_S ))
            log "restart drill: serve run again, the compile cache kept (health wait at most $HEALTH_WAIT_S s)"
            start_serve _restart
            log "restart drill: both sessions resume (at most $(left) s)"
            timeout "$(left)" $PY -m benchmarks.worlds.restart_drill --phase resume "${DRILL[@]}" \
                --healthy-s "$(cat "$OUT/time_to_healthy_restart_s")" --stopped-at "$STOPPED_AT" \
                --out "$OUT/restart_drill.json" 2>&1 | tee -a "$OUT/gpu_serve.log"
        else
            log "restart drill: the live sessions failed (gpu_serve.log); Serve not restarted"
        fi
    else
        log "restart drill skipped: under 150 s of budget left (a restart alone takes ~85 s warm)"
    fi
fi
