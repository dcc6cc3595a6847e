import asyncio
from collections.abc import Callable


async def wait_for(cond: Callable[[], bool], within: float = 5.0) -> None:
    """Poll a condition with a deadline (never a bare sleep as synchronisation)."""
    loop = asyncio.get_running_loop()
    end = loop.time() + within
    while not cond():
        if loop.time() > end:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(0.005)
