#!/usr/bin/env bash
# Runs the examples against a local `parsyn server` with local workers, on small stand-ins for the real inputs:
#   examples/run.sh [llama|tabular|all]        (default: llama)
# llama:   distributed-llama-finetune.json on a tiny Llama model (`parsyn model init`) and a generated instruction
#          set, with three workers and the rounds and steps cut down so it finishes in a few minutes on a laptop.
# tabular: tabular-mlp.json on a generated CSV with two workers. The starting model folder comes from
#          `parsyn model init --architecture mlp --data CSV` (standardisation and classes from the whole file), so
#          every worker trains the same model; all weights are FedAvg'ed (use_peft false). See docs/training.md.
# Everything lives in a temporary folder (kept with KEEP=1) and every process started here is stopped on exit.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
PARSYN=${PARSYN:-build/src/cli/parsyn}
PY=/usr/bin/python3
WHICH=${1:-llama}
[ -x "$PARSYN" ] || { echo "run.sh: $PARSYN not found; build first (./dev build)" >&2; exit 1; }

WORK=$(mktemp -d /tmp/parsyn-examples-XXXXXX)
PIDS=()
cleanup() {
  for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
  if [ "${KEEP:-0}" = 1 ]; then echo "kept $WORK"; else rm -rf "$WORK"; fi
}
trap cleanup EXIT

PORT=$($PY -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
export PARSYN_DATA_DIR=$WORK/server   # the CLI finds the server's URL and admin key here
"$PARSYN" server --data-dir "$PARSYN_DATA_DIR" --listen "127.0.0.1:$PORT" >"$WORK/server.log" 2>&1 &
PIDS+=($!)
for _ in $(seq 100); do [ -f "$PARSYN_DATA_DIR/server.json" ] && break; sleep 0.1; done
URL=http://127.0.0.1:$PORT
echo "server: $URL (log: $WORK/server.log)"

# Registers N workers and starts them; sets WORKERS to their ids as a JSON list. (Not run in a $(...) subshell:
# PIDS must reach the cleanup.)
start_workers() {
  local n=$1 ids=()
  for i in $(seq "$n"); do
    local out token id
    out=$("$PARSYN" worker register --name "example-$i-$RANDOM")
    id=$(sed -n 's/^worker \([0-9]*\) .*/\1/p' <<<"$out")
    token=$(sed -n 's/^token .*: \(.*\)$/\1/p' <<<"$out")
    "$PARSYN" worker --server "$URL" --token "$token" --name "w$id" --cache-dir "$WORK/cache-$id" --threads 1 \
      >"$WORK/worker-$id.log" 2>&1 &
    PIDS+=($!)
    ids+=("$id")
  done
  local IFS=,
  WORKERS="[${ids[*]}]"
}

# Rewrites an example spec for this run: ids, and smaller rounds/steps for a quick local run.
localize() {  # spec dataset_id model_id worker_ids rounds steps [extra config json]
  $PY - "$@" <<'PYEOF'
import json, sys
spec = json.load(open(sys.argv[1]))
spec["dataset_id"], spec["model_id"] = int(sys.argv[2]), int(sys.argv[3])
ids = json.loads(sys.argv[4])
spec["distributed"].update(num_rounds=int(sys.argv[5]), steps_per_round=int(sys.argv[6]),
                           min_workers=len(ids), max_workers=len(ids), aggregation_timeout=300)
spec["worker_selection"] = {"mode": "own", "worker_ids": ids}
if len(sys.argv) > 7: spec["config"].update(json.loads(sys.argv[7]))
print(json.dumps(spec, indent=2))
PYEOF
}

run_job() {  # spec-file
  local out id
  out=$("$PARSYN" job create -f "$1")
  echo "$out"
  id=$(sed -n 's/^created training job \([0-9]*\).*/\1/p' <<<"$out")
  "$PARSYN" job watch "$id"
  "$PARSYN" job get "$id"
}

llama() {
  echo "== distributed-llama-finetune"
  "$PARSYN" model init --out "$WORK/tiny-llama" --hidden-size 64 --layers 2 --heads 4 --max-position-embeddings 256
  $PY - "$WORK/instructions.jsonl" <<'PYEOF'
import json, random, sys
random.seed(1)
with open(sys.argv[1], "w") as f:
    for i in range(400):
        a, b = random.randint(0, 9), random.randint(0, 9)
        f.write(json.dumps({"prompt": f"add {a} and {b}:", "completion": f" {a + b}"}) + "\n")
PYEOF
  local model dataset
  model=$("$PARSYN" model upload "$WORK/tiny-llama" --name tiny-llama | sed -n "s/^model \([0-9]*\) .*/\1/p")
  dataset=$("$PARSYN" dataset upload "$WORK/instructions.jsonl" | grep -o 'dataset [0-9]*' | head -1 | cut -d' ' -f2)
  start_workers 3
  localize examples/distributed-llama-finetune.json "$dataset" "$model" "$WORKERS" 3 20 \
    '{"epochs": 1, "learning_rate": 0.002, "lora_r": 8, "lora_alpha": 16, "max_seq_len": 32}' >"$WORK/llama-job.json"
  run_job "$WORK/llama-job.json"
}

tabular() {
  echo "== tabular-mlp"
  $PY - "$WORK/points.csv" <<'PYEOF'
import random, sys
random.seed(2)
with open(sys.argv[1], "w") as f:
    f.write("x1,x2,label\n")
    for _ in range(600):
        x1, x2 = random.uniform(-1, 1), random.uniform(-1, 1)
        f.write(f"{x1:.4f},{x2:.4f},{int(x1 + x2 > 0)}\n")
PYEOF
  # The starting model every worker receives: its feature scaling and class list come from the whole CSV.
  "$PARSYN" model init --architecture mlp --data "$WORK/points.csv" --hidden-sizes 16 --out "$WORK/tabular-model"
  local model dataset
  model=$("$PARSYN" model upload "$WORK/tabular-model" --name points-mlp | sed -n "s/^model \([0-9]*\) .*/\1/p")
  dataset=$("$PARSYN" dataset upload "$WORK/points.csv" | grep -o 'dataset [0-9]*' | head -1 | cut -d' ' -f2)
  start_workers 2
  localize examples/tabular-mlp.json "$dataset" "$model" "$WORKERS" 3 20 >"$WORK/tabular-job.json"
  run_job "$WORK/tabular-job.json"
}

case "$WHICH" in
  llama) llama ;;
  tabular) tabular ;;
  all) llama; tabular ;;
  *) echo "usage: examples/run.sh [llama|tabular|all]" >&2; exit 2 ;;
esac
