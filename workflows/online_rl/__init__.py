"""The main job (``python -m workflows.online_rl``): rollout workers, trajectory buffer, the Ray
Data stream into the trainer, Entropulse phases, metrics, and the wiring of them all (``job``)."""
