#!/bin/sh
# profiles (py-spy, c=64, 8 s), the routing-cost bench, the loop check: each build
cd /work/main
.venv/bin/python benchmarks/results/2026-12-02-hotpath/raw/profile.py /tmp/hp2/snap_before /work/main/benchmarks/results/2026-12-02-hotpath/raw2/profile_before 8 > /work/main/benchmarks/results/2026-12-02-hotpath/raw2/profile_before.log 2>&1
.venv/bin/python benchmarks/results/2026-12-02-hotpath/raw/profile.py /tmp/hp2/snap_after /work/main/benchmarks/results/2026-12-02-hotpath/raw2/profile_after 8 > /work/main/benchmarks/results/2026-12-02-hotpath/raw2/profile_after.log 2>&1
(cd /tmp/hp2/snap_after && PYTHONPATH=/tmp/hp2/snap_after /work/main/.venv/bin/python -m gateway.cli bench routing-cost --out /work/main/benchmarks/results/2026-12-02-hotpath/raw2/routing_cost_after) > /work/main/benchmarks/results/2026-12-02-hotpath/raw2/routing_cost_after.log 2>&1
(cd /tmp/hp2/snap_before && PYTHONPATH=/tmp/hp2/snap_before /work/main/.venv/bin/python -m gateway.cli bench routing-cost --out /work/main/benchmarks/results/2026-12-02-hotpath/raw2/routing_cost_before) > /work/main/benchmarks/results/2026-12-02-hotpath/raw2/routing_cost_before.log 2>&1
(cd /tmp/hp2/snap_after && PYTHONPATH=/tmp/hp2/snap_after /work/main/.venv/bin/python -m benchmarks.overhead_loop --concurrency 1,16,64 --requests 600 --out /work/main/benchmarks/results/2026-12-02-hotpath/raw2/loop_check_after.json) > /work/main/benchmarks/results/2026-12-02-hotpath/raw2/loop_check_after.log 2>&1
for i in 1 2 3; do for b in before after; do (cd /tmp && /work/main/.venv/bin/python /tmp/hp2/tools/micro.py /tmp/hp2/snap_$b | sed "s/^/$b /"); done; done > /work/main/benchmarks/results/2026-12-02-hotpath/raw2/micro.log 2>&1
