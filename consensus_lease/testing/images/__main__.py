"""``python -m consensus_lease.testing.images [RECIPE ...] [--force]``."""

import sys

from .build import main

sys.exit(main())
