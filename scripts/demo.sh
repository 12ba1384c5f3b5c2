#!/usr/bin/env bash
# `make demo`: the main job on local disk — train, get interrupted, resume, then list, verify and gc.
set -euo pipefail
cd "$(dirname "$0")/.."
RLCKPT=.venv/bin/rlckpt
RUN=${DEMO_RUN_DIR:-demo-run}
STEPS=${DEMO_STEPS:-12}

has_bundle_at_least() {  # has_bundle_at_least STEP: a committed bundle >= STEP exists
  "$RLCKPT" ls "$RUN" --json 2>/dev/null | .venv/bin/python -c \
    'import json, sys; sys.exit(0 if any(e["state"] == "committed" and e["step"] >= int(sys.argv[1]) for e in json.load(sys.stdin)) else 1)' "$1"
}

rm -rf "$RUN"
echo "== 1/4  train a tiny GRPO on local disk ($RUN), saving every 2 steps; interrupt it after step 4's bundle"
"$RLCKPT" train --run-dir "$RUN" --steps "$STEPS" --save-every 2 &
pid=$!
until has_bundle_at_least 4; do
  kill -0 "$pid" 2>/dev/null || break
  sleep 1
done
kill -TERM "$pid" 2>/dev/null || true   # the CLI shuts Ray and TransferQueue down cleanly on SIGTERM
wait "$pid" || echo "   (training stopped: exit $?)"

echo "== 2/4  what the interrupted run left (only committed bundles are resumable)"
"$RLCKPT" ls "$RUN"

echo "== 3/4  resume on a fresh Ray cluster from the newest committed bundle"
"$RLCKPT" train --run-dir "$RUN" --steps "$STEPS" --save-every 2

echo "== 4/4  list, verify every digest of the newest bundle, and show what gc would remove"
"$RLCKPT" ls "$RUN"
"$RLCKPT" verify "$RUN"
"$RLCKPT" gc "$RUN" --keep-last 3 --dry-run
