#!/usr/bin/env bash
# The README's test command: set up (idempotent), lint, type-check, then the default test suite
# (CPU only).
# Extra arguments go to pytest, e.g. `bash scripts/test.sh -m "not integration"`.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash scripts/setup.sh
VENV=${CSD_VENV:-.venv}
export DS_ACCELERATOR=cpu HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 RAY_DEDUP_LOGS=0 PYTHONUNBUFFERED=1
echo "[test] ruff"
"$VENV/bin/ruff" check --quiet .
"$VENV/bin/ruff" format --check --quiet .
echo "[test] mypy"
"$VENV/bin/mypy"  # the packages listed under [tool.mypy] in pyproject.toml
echo "[test] pytest"
set +e
"$VENV/bin/python" -m pytest -q "$@"
rc=$?
set -e
# pytest's 5 means "no tests collected": never a pass.
if [ "$rc" -eq 5 ]; then echo "[test] no tests were collected: failing"; exit 1; fi
exit "$rc"
