"""Ray Train loops: pure loss functions, batching of step samples, the RL and SFT trainers.

Module map (nothing is imported here; import the module you need):

- ``config``        pydantic configs (no torch/ray): LossConfig, OptimConfig, TrainerConfig,
                    RLTrainConfig, SFTTrainConfig, cpu_trainer()
- ``schema``        Arrow schemas of step samples and SFT samples (the rollout ↔ trainer contract)
- ``losses``        pure torch losses of METHOD.md §4–§5 returning ``(loss, metrics)``
- ``self_distill``  the self-distillation variants behind one interface
- ``batching``      rows → Qwen3-VL inputs (exact token ids, screenshots, response window)
- ``objectives``    RL and SFT objectives: one micro-batch → loss
- ``engine``        DeepSpeed config/engine, reference model, full-weight gathering
- ``checkpoint``    HF-format checkpoints + optimizer/trainer state, resume decisions
- ``stream``        fixed-size row batches from a (possibly endless) Ray Data shard
- ``metrics``       cross-rank metric reduction, staleness, metrics/events file names
- ``jsonl``         the project's one JSON-lines writer and reader
- ``loop``          the Ray Train worker function shared by RL and SFT
- ``trainers``      build_rl_trainer / build_sft_trainer → TorchTrainer
- ``sample_maker``  real step/SFT samples from a checkpoint without an environment
"""
