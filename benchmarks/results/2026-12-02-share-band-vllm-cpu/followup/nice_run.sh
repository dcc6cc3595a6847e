#!/bin/sh
# Renice every gateway serve process to -10 while the replay runs.
( while true; do for p in $(pgrep -f "gateway.cli --log-level warning serve"); do renice -n -10 -p $p >/dev/null 2>&1; done; sleep 0.5; done ) &
W=$!
cd /tmp/snap_band && PYTHONPATH=/tmp/snap_band /work/main/.venv/bin/python -m gateway.cli bench replay --fleet vllm-cpu --replicas 4 --in-flight 4 --rounds 1 --workloads long_prefixes --contenders direct,gateway:default --out /tmp/nice_out > /tmp/nice_run.log 2>&1
kill $W
