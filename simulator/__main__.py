"""`python -m simulator ...` (the same as `llm-gateway sim ...`)."""

import sys

from simulator.cli import main

sys.exit(main())
