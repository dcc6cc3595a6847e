"""The programs the tests and benchmarks start for real: Redis, nginx, wrk, chromium (Debian)."""

from __future__ import annotations

import os
import shutil
import subprocess

# Program on PATH -> the Debian package that provides it.
PROGRAMS = {
    "redis-server": "redis-server",
    "nginx": "nginx-light",
    "wrk": "wrk",
    # The admin dashboard's browser test (Playwright drives it; it downloads no browser).
    "chromium": "chromium",
}
# nginx lives in /usr/sbin, which a non-login PATH may lack.
_EXTRA_PATH = ("/usr/sbin", "/sbin")


class SystemDepsError(RuntimeError):
    """A program the suite needs is missing and could not be installed."""


def which(program: str) -> str | None:
    """The program's path, looking in /usr/sbin too."""
    found = shutil.which(program)
    if found is not None:
        return found
    return shutil.which(program, path=os.pathsep.join(_EXTRA_PATH))


def ensure() -> list[str]:
    """Install the missing programs with apt-get (no-op when all are there); the packages added."""
    missing = sorted({pkg for prog, pkg in PROGRAMS.items() if which(prog) is None})
    if not missing:
        return []
    if shutil.which("apt-get") is None:
        raise SystemDepsError(f"missing {', '.join(missing)} and no apt-get to install them")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    try:
        subprocess.run(["apt-get", "update", "-qq"], check=True, env=env, timeout=600)
        subprocess.run(
            ["apt-get", "install", "-y", "-qq", "--no-install-recommends", *missing],
            check=True,
            env=env,
            timeout=900,
        )
    except (OSError, subprocess.SubprocessError) as exc:
        raise SystemDepsError(f"apt-get install {' '.join(missing)} failed: {exc}") from exc
    still = [prog for prog in PROGRAMS if which(prog) is None]
    if still:
        raise SystemDepsError(f"still missing after apt-get: {', '.join(still)}")
    return missing
