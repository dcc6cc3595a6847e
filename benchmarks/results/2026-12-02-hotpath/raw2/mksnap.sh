#!/bin/sh
# AFTER build: HEAD + only this work's files (http_client.py: only this work's hunks over HEAD).
set -e
SNAP=${1:-/tmp/hp2/snap_after}
rm -rf $SNAP && mkdir -p $SNAP
cd /work/main
git archive HEAD | tar -x -C $SNAP
for f in routing/types.py routing/router.py vllm_api/chat_template.py gateway/proxy/identity.py \
         gateway/proxy/headers.py gateway/proxy/http_response.py gateway/replicas/pool.py \
         gateway/replicas/state.py gateway/http/protocol.py gateway/http/transport.py \
         benchmarks/routing_cost.py benchmarks/overhead_loop.py cache_index/prefix_index.py \
         routing/scoring.py gateway/proxy/affinity.py gateway/proxy/tenancy.py; do
  cp $f $SNAP/$f
done
git show HEAD:gateway/proxy/http_client.py > $SNAP/gateway/proxy/http_client.py
python3 - $SNAP/gateway/proxy/http_client.py <<'PY'
import sys
p = sys.argv[1]; s = open(p).read()
for a, b in [
    ('self._headers: list[tuple[str, str]] = []', 'self._headers: list[tuple[bytes, bytes]] = []'),
    ('self._headers.append((name.decode("latin-1").lower(), value.decode("latin-1")))', 'self._headers.append((name.lower(), value))'),
    ('return "content-length" not in names and "transfer-encoding" not in names', 'return b"content-length" not in names and b"transfer-encoding" not in names'),
]:
    assert a in s, a
    s = s.replace(a, b)
open(p, "w").write(s)
PY
cd $SNAP && diff -rq /tmp/hp2/snap_before . | sort
