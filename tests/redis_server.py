"""A real redis-server on 127.0.0.1, a free port and a temp dir: started, stopped, restarted."""

from __future__ import annotations

import socket
import subprocess
import time
from pathlib import Path

from tests.system_programs import program


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def ping(port: int, timeout: float = 0.2) -> bool:
    """True when a server on `port` answers PING now (raw RESP: no client state involved)."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
            s.sendall(b"PING\r\n")
            return s.recv(16).startswith(b"+PONG")
    except OSError:
        return False


class RedisServer:
    """One redis-server process; `restart` brings it back empty on the same port."""

    def __init__(self, directory: Path) -> None:
        self.binary = program("redis-server")
        self.dir = directory
        self.port = _free_port()
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def _args(self) -> list[str]:
        # No persistence: a restart comes back empty, as a crashed cache would.
        return [
            "--port", str(self.port), "--bind", "127.0.0.1", "--dir", str(self.dir),
            "--save", "", "--appendonly", "no", "--protected-mode", "no",
        ]  # fmt: skip

    def start(self) -> None:
        self._proc = subprocess.Popen(
            [self.binary, *self._args()],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 10.0
        while not ping(self.port):
            if self._proc.poll() is not None:
                raise RuntimeError(f"redis-server exited with {self._proc.returncode}")
            if time.monotonic() > deadline:
                raise RuntimeError("redis-server did not answer PING within 10 s")
            time.sleep(0.01)

    def stop(self) -> None:
        """Kill it (no save: it comes back empty)."""
        proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)

    def restart(self) -> None:
        self.stop()
        self.start()
