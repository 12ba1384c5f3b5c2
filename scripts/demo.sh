#!/usr/bin/env bash
# `make demo`: the main job on local disk — train, get preempted (SIGTERM: it saves where it is and
# stops), resume from that bundle, then list, verify and gc.
set -euo pipefail
cd "$(dirname "$0")/.."
RLCKPT=.venv/bin/rlckpt
RUN=${DEMO_RUN_DIR:-demo-run}
STEPS=${DEMO_STEPS:-40}

has_bundle_at_least() {  # has_bundle_at_least STEP: a committed bundle >= STEP exists
  "$RLCKPT" ls "$RUN" --json 2>/dev/null | .venv/bin/python -c \
    'import json, sys; sys.exit(0 if any(e["state"] == "committed" and e["step"] >= int(sys.argv[1]) for e in json.load(sys.stdin)) else 1)' "$1"
}

rm -rf "$RUN"
echo "== 1/4  train a tiny GRPO on local disk ($RUN), saving every 10 steps; SIGTERM it after step 10's bundle"
"$RLCKPT" train --run-dir "$RUN" --steps "$STEPS" --save-every 10 &
pid=$!
until has_bundle_at_least 10; do
  kill -0 "$pid" 2>/dev/null || break
  sleep 1
done
kill -TERM "$pid" 2>/dev/null || true   # like a preemption: it finishes its step, saves it and exits 0
status=0
wait "$pid" || status=$?
echo "   (training stopped: exit $status)"

echo "== 2/4  what the preempted run left: its bundles, the newest at the step it reached (no debris)"
"$RLCKPT" ls "$RUN"

echo "== 3/4  resume on a fresh Ray cluster from that bundle"
"$RLCKPT" train --run-dir "$RUN" --steps "$STEPS" --save-every 10

echo "== 4/4  list, verify every digest of the newest bundle, and show what gc would remove"
"$RLCKPT" ls "$RUN"
"$RLCKPT" verify "$RUN"
"$RLCKPT" gc "$RUN" --keep-last 3 --dry-run
