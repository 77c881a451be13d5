"""``python -m consensus_lease.cli``: the ``consensus-lease`` command."""

import sys

from . import main

sys.exit(main())
