#!/bin/sh
cd /work/main
.venv/bin/python benchmarks/results/2026-12-02-hotpath/raw/profile.py /tmp/hp2/snap_after /work/main/benchmarks/results/2026-12-02-hotpath/raw2/profile_after_final 8 > /work/main/benchmarks/results/2026-12-02-hotpath/raw2/profile_after_final.log 2>&1
.venv/bin/python -m gateway.cli bench overhead --harness wrk --gateway after2=/tmp/hp2/snap_after@2 --gateway after=/tmp/hp2/snap_after --concurrency 64 --rounds 2 --duration 5 --warmup 2 --stream no --out /work/main/benchmarks/results/2026-12-02-hotpath/raw2/workers2 > /work/main/benchmarks/results/2026-12-02-hotpath/raw2/workers2.log 2>&1
for i in 1 2 3 4 5 6; do for b in /tmp/hp2/snap_before /tmp/hp2/snap_after; do .venv/bin/python benchmarks/results/2026-12-02-hotpath/raw/profile.py $b - 4 2>&1 | tail -n 1; done; done > /work/main/benchmarks/results/2026-12-02-hotpath/raw2/ab_pairs.log
