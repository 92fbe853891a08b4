#!/usr/bin/env bash
# Idempotent set-up on a fresh Debian/Ubuntu machine: Chromium + ChromeDriver (for the embedded
# MiniWoB++ environment), a virtualenv at $CSD_VENV (default .venv) with this project and its
# dev tools. A second run only checks and returns in seconds.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
VENV=${CSD_VENV:-.venv}
PYTHON=${CSD_PYTHON:-python3}

say() { printf '[setup] %s\n' "$*"; }

if ! command -v chromium >/dev/null || ! command -v chromedriver >/dev/null; then
    say "installing Debian chromium + chromium-driver (once)"
    SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
    $SUDO apt-get update -qq >/dev/null
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq chromium chromium-driver >/dev/null
fi

if [ ! -x "$VENV/bin/python" ]; then
    say "creating virtualenv $VENV"
    "$PYTHON" -m venv "$VENV"
fi

# Re-install only when the dependency list changed (the stamp holds pyproject.toml's hash).
stamp="$VENV/.computersd-installed"
want=$(sha256sum pyproject.toml | cut -d' ' -f1)
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
    say "installing Python dependencies into $VENV (first time: a few minutes; torch comes from local disk)"
    "$VENV/bin/python" -m pip install -q --disable-pip-version-check --no-compile -e '.[dev]' 2>&1 \
        | grep -v -E "^WARNING: Location 'file:" || true
    DS_ACCELERATOR=cpu "$VENV/bin/python" -c "import torch, torchvision, ray, transformers, deepspeed, miniwob" 2>/dev/null \
        || { say "dependency check failed"; exit 1; }
    echo "$want" > "$stamp"
fi
say "ready: $VENV ($("$VENV/bin/python" -c 'import torch, ray, transformers; print(f"torch {torch.__version__}, ray {ray.__version__}, transformers {transformers.__version__}")'))"
