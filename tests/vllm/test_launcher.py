"""The launcher fails loudly: a missing engine or a replica that cannot start says why."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from benchmarks.vllm_cpu import VllmCpuError, VllmFleet
from tests.vllm.conftest import TIMEOUT_S

pytestmark = [pytest.mark.asyncio(loop_scope="package"), pytest.mark.timeout(TIMEOUT_S)]


async def test_missing_engine_names_the_prepare_command(tmp_path: Path) -> None:
    with pytest.raises(VllmCpuError, match=re.escape("python -m benchmarks.vllm_cpu prepare")):
        async with VllmFleet(1, root=tmp_path):
            pass


async def test_a_replica_that_exits_fails_with_its_log_tail(tmp_path: Path) -> None:
    bad = VllmFleet(1, lora=False, kv_events=False, log_dir=tmp_path,
                    extra_args=("--no-such-flag",))  # fmt: skip
    with pytest.raises(VllmCpuError) as info:
        await bad.start()
    message = str(info.value)
    assert "vllm-0 exited with code" in message
    assert "--no-such-flag" in message  # argparse's complaint, from the log tail
    # Stopped and reaped: the pid is gone.
    with pytest.raises(ProcessLookupError):
        os.kill(bad.replicas[0].pid, 0)
