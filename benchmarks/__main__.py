"""`python -m benchmarks NAME [flags]`, `--suite quick|claims|gpu`, `--list` (benchmarks/harness.py)."""

import sys

from benchmarks.harness import main

sys.exit(main())
