"""``python -m workflows.warm_start``: build or find the cached warm start (see :mod:`.cli`)."""

import sys

from workflows.warm_start.cli import main

sys.exit(main())
