"""Entry point: `python -m benchmarks.vllm_cpu`."""

import sys

from benchmarks.vllm_cpu.cli import main

sys.exit(main())
