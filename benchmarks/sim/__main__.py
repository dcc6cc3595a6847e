"""`python -m benchmarks.sim ...` (the same as `llm-gateway sim ...`)."""

import sys

from benchmarks.sim.cli import main

sys.exit(main())
