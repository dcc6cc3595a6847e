"""Per-request pieces, timed in one build: python micro.py SRC -> JSON of min-of-5 us."""

import json
import sys
import timeit

sys.path.insert(0, sys.argv[1])
import orjson

from gateway.config import CacheIndexConfig, ReplicaConfig
from gateway.proxy.affinity import Affinity
from gateway.proxy.headers import client_response_headers
from gateway.proxy.http_response import ResponseHeaders
from gateway.proxy.identity import new_request_id
from gateway.proxy.requests import parse_request
from gateway.replicas.pool import ReplicaPool
from routing.profile import BUILTIN_PROFILES
from routing.router import Router
from routing.types import RequestFeatures
from vllm_api.chat_template import ChatTemplate

assert __import__("routing.types").__file__.startswith(sys.argv[1]), "wrong build"
pool = ReplicaPool.from_configs(
    (ReplicaConfig(url="http://127.0.0.1:1", name="nginx", models=("m",)),)
)
for r in pool:
    r.healthy = True
router = Router(BUILTIN_PROFILES["default"])
aff = Affinity(CacheIndexConfig(), is_lora=lambda m: False)
body = orjson.dumps(
    {
        "model": "m",
        "messages": [
            {"role": "system", "content": "You are a helpful assistant."},
            {"role": "user", "content": "Hello there, how are you today?"},
        ],
        "max_tokens": 16,
    }
)
req = parse_request("chat", body, "rid")
headers = [(b"host", b"x"), (b"content-type", b"application/json"), (b"content-length", b"120")]
feats = aff.features(req, headers)
aff.record(feats, "nginx")
feats = aff.features(req, headers)
tmpl = ChatTemplate()
msgs = orjson.loads(body)["messages"]
raw = [
    (b"server", b"nginx"),
    (b"date", b"Wed, 02 Dec 2026 06:00:00 GMT"),
    (b"content-type", b"application/json"),
    (b"content-length", b"482"),
    (b"connection", b"keep-alive"),
]
if "raw" in ResponseHeaders.__slots__:
    rh = ResponseHeaders(raw)
else:  # before: the client decoded each header (not timed here)
    rh = ResponseHeaders([(k.decode(), v.decode()) for k, v in raw])
r0 = pool["nginx"]


def snap_churn():
    r0.in_flight += 1
    s = pool.snapshots()
    r0.in_flight -= 1
    return s


snaps = pool.snapshots()
cases = {
    "parse_request": lambda: parse_request("chat", body, "rid"),
    "features": lambda: aff.features(req, headers),
    "render": lambda: tmpl.render(msgs),
    "snapshots_churn": snap_churn,
    "route": lambda: router.route(feats, snaps),
    "request_id": new_request_id,
    "response_headers": lambda: client_response_headers(rh.items(), "rid"),
    "RequestFeatures": lambda: RequestFeatures("m", "rid", 10),
}
out = {}
for name, fn in cases.items():
    n = 20000
    out[name] = round(min(timeit.repeat(fn, number=n, repeat=5)) / n * 1e6, 3)
print(json.dumps(out))
