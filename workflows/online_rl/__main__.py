"""``python -m workflows.online_rl``: the main job's command line (see :mod:`.cli`)."""

import sys

from workflows.online_rl.cli import main

sys.exit(main())
