"""The black-box conformance suite (tests/conformance) pointed at a real vLLM replica."""

from __future__ import annotations

import pytest

from benchmarks.vllm_cpu import VLLM_VERSION, VllmFleet
from tests.vllm.conftest import TIMEOUT_S, run_conformance

pytestmark = [pytest.mark.asyncio(loop_scope="package"), pytest.mark.timeout(TIMEOUT_S)]

# Conformance tests vLLM 0.32.0 fails, deselected with the reason: empty, the suite asserts
# vLLM's behaviour and the simulator follows it (test_vllm_032_behaviour.py compares the two).
# An engine upgrade that changes behaviour is listed here until suite and simulator follow.
#
# vLLM behaviours the simulator deliberately does not copy, so no test asserts them:
# - its Responses store grows without bound ("may cause a memory leak", its own warning); the
#   simulator drops the oldest beyond SimConfig.responses_store_size;
# - GET /v1/responses/{id}?stream=true of a response that was not a background stream breaks
#   the connection mid-body (an exception inside its event generator); the simulator answers
#   the stored JSON and does not replay events;
# - a background *stream* keeps generating after its client leaves; the simulator aborts it
#   with the connection, as it does every stream.
KNOWN_DIFFERENCES: dict[str, str] = {}


async def test_conformance_suite_passes_against_real_vllm(fleet: VllmFleet) -> None:
    replica = fleet.replicas[0]
    assert replica.kv_events_endpoint and replica.replay_endpoint
    env = {
        "LLMGW_VLLM_URL": replica.url,
        "LLMGW_VLLM_MODEL": fleet.model,
        "LLMGW_VLLM_ZMQ": replica.kv_events_endpoint,
        "LLMGW_VLLM_REPLAY": replica.replay_endpoint,
        "LLMGW_VLLM_BLOCK_SIZE": str(fleet.block_size),
    }
    # Nothing skipped: the pooling and audio replicas' tests are deselected (their own modules,
    # test_pooling_vllm.py and test_audio_vllm.py, run them).
    ignore = ("--ignore", "tests/conformance/test_sim_faults.py")
    what = f"conformance vs vLLM {VLLM_VERSION}"
    await run_conformance(env, KNOWN_DIFFERENCES, "tests/conformance", *ignore, what=what)
