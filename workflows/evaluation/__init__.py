"""Evaluation (METHOD.md §8, ``python -m workflows.evaluation``): Pass@1 over the eval split for
several checkpoints (``evaluate``) and its tables and chart (``report``)."""
