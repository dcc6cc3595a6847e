#!/bin/bash
# usage: profile.sh SNAPDIR OUTDIR VARIANTS -- bench while py-spy records the first shared-state gateway
SNAP=$1; OUT=$2; VAR=$3; mkdir -p $OUT
cd $SNAP
PYTHONPATH=$SNAP .venv/bin/python -m gateway.cli bench routing --fleet sim --workloads shared_prefix --rates 20 --step-s 30 --gateway default --no-peers --seeds 0 --variants $VAR --out $OUT/bench > $OUT/bench.log 2>&1 &
BENCH=$!
GW=""
while kill -0 $BENCH 2>/dev/null; do
  for p in $(pgrep -f "gateway.cli --log-level .* serve -c"); do
    cfg=$(tr '\0' ' ' < /proc/$p/cmdline | sed -n 's/.* -c \([^ ]*\).*/\1/p')
    if [ -n "$cfg" ] && grep -q '^\[shared_state\]' "$cfg" 2>/dev/null; then GW=$p; break; fi
  done
  [ -n "$GW" ] && break
  sleep 0.5
done
RS=$(pgrep -P $BENCH -x redis-server | head -1)
PORT=$(tr "\0" " " < /proc/$RS/cmdline | sed -n "s/.*:\([0-9][0-9]*\).*/\1/p")
echo "gateway pid $GW redis pid $RS port $PORT" > $OUT/pids.txt
sleep 12
cpu() { awk '{print $14+$15}' /proc/$1/stat; }
redis-cli -p $PORT config resetstat > /dev/null
echo "redis start $(cpu $RS) gw start $(cpu $GW) $(date +%s.%N)" >> $OUT/pids.txt
/work/main/.venv/bin/py-spy record --nonblocking -r 200 -d 15 -f raw -o $OUT/gw.raw -p $GW > $OUT/pyspy.log 2>&1
echo "redis end $(cpu $RS) gw end $(cpu $GW) $(date +%s.%N)" >> $OUT/pids.txt
redis-cli -p $PORT info commandstats > $OUT/commandstats.txt
redis-cli -p $PORT info cpu > $OUT/rediscpu.txt
grep -n "step 1/1" $OUT/bench.log | tail -1 >> $OUT/pids.txt
wait $BENCH
echo "bench rc $?" >> $OUT/pids.txt
