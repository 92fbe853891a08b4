"""The jobs a user runs, one subpackage each, and what they share.

- ``online_rl/``   the main job: async online RL with value-gated self-distillation
- ``analyzer/``    the GUI-analyzer pipeline: collect → annotate → train
- ``evaluation/``  Pass@1 of checkpoints on the eval split, with reports
- ``common/``      shared by the jobs: config loading, Ray start-up, tiny models, playing
                   episodes, the plumbing and config of the offline commands
- ``configs/``     the checked-in YAML configs of every run
"""
