#!/bin/sh
# Install the peer routers for `llm-gateway bench routing` into venvs under
# ${LLMGW_CACHE:-$HOME/.cache/llm-gateway}/peers (idempotent; --force reinstalls).
# Usage: scripts/setup_peers.sh [--force] [sglang-router] [vllm-router] [litellm]
set -eu
cd "$(dirname "$0")/.."
PY="${PYTHON:-.venv/bin/python}"
[ -x "$PY" ] || PY=python3
exec "$PY" -m benchmarks.routing_bench.peers setup "$@"
