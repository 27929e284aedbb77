"""`python -m shardwise.cli`: the same as the `shardwise` command."""

import sys

from shardwise.cli import main

sys.exit(main())
