import argparse
import asyncio
import os
import signal
import sys

import aiohttp

from simulator.cli import add_arguments, config_from_args


def test_every_knob_is_an_option() -> None:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(
        ["--lora-adapters", "a,b", "--time-scale", "10", "--enable-prefix-caching", "false",
         "--eos-after-tokens", "7", "--fault-error-rate", "0.25", "--fault-reset-after-tokens", "3"]
    )  # fmt: skip
    cfg = config_from_args(args)
    assert cfg.lora_adapters == ("a", "b") and cfg.time_scale == 10.0
    assert cfg.enable_prefix_caching is False and cfg.eos_after_tokens == 7
    assert cfg.faults.error_rate == 0.25 and cfg.faults.reset_after_tokens == 3
    assert all(a.help for a in parser._actions)


async def test_module_runs_a_fleet_until_sigint() -> None:
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(__file__))))
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "simulator", "--replicas", "2", "--base-port", "0",
        stdout=asyncio.subprocess.PIPE, cwd=root,
    )  # fmt: skip
    assert proc.stdout is not None
    try:
        lines = []
        while True:
            line = (await asyncio.wait_for(proc.stdout.readline(), 30)).decode().strip()
            assert line, "simulator exited early"
            if line == "ready":
                break
            lines.append(line)
        assert len(lines) == 2 and all("kv_events=tcp://" in ln for ln in lines)
        async with aiohttp.ClientSession() as s:
            for ln in lines:
                async with s.get(ln.split()[1] + "/health") as resp:
                    assert resp.status == 200
        proc.send_signal(signal.SIGINT)
        assert await asyncio.wait_for(proc.wait(), 10) == 0
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
