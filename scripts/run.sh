#!/usr/bin/env bash
# The README's first command: set up (idempotent), then run the main job (online RL) on the
# embedded default: local Ray cluster, MiniWoB++ in headless Chromium, tiny Qwen3-VL models.
# Extra arguments go to the job, e.g. `bash scripts/run.sh trainer.max_steps=4`.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash scripts/setup.sh
VENV=${CSD_VENV:-.venv}
export DS_ACCELERATOR=cpu HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONUNBUFFERED=1
exec "$VENV/bin/python" -m workflows.online_rl --config embedded "$@"
