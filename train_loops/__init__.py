"""Ray Train loops: pure loss functions, batching of step samples, the RL and SFT trainers."""
