"""``python -m workflows.evaluation``: Pass@1 of checkpoints (see :mod:`.evaluate`)."""

import sys

from workflows.evaluation.evaluate import main

sys.exit(main())
