"""The GUI-analyzer pipeline (METHOD.md §6): ``collect`` transitions, ``annotate`` them with an
expert (``experts``, the ground-truth ``oracle``), ``train`` the analyzer; ``transitions`` is the
stored schema. Each command is ``python -m workflows.analyzer.<name>``."""
