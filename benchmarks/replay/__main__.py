"""`python -m benchmarks.replay ...` (the same as `llm-gateway bench replay ...`)."""

import sys

from benchmarks.replay.cli import main

sys.exit(main())
