"""`python -m benchmarks.routing_bench ...` (the same as `llm-gateway bench routing ...`)."""

import sys

from benchmarks.routing_bench.cli import main

sys.exit(main())
