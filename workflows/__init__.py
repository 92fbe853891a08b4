"""The jobs a user runs (online RL, analyzer pipeline, evaluation) and their configs."""
