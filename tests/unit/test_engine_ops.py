"""DeepSpeed's comm backend on the CPU accelerator starts without compiling its shm op."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

# A fresh interpreter: the op table is process-wide state, and the point is a first start.
SCRIPT = r"""
import json, os, sys
import torch.distributed as dist
from train_loops.engine import cpu_op_env, skip_shm_comm_op
cpu_op_env()
if sys.argv[1] == "skip":
    skip_shm_comm_op()
dist.init_process_group("gloo", init_method="file://" + sys.argv[2], rank=0, world_size=1)
import deepspeed
from deepspeed.comm import comm as ds_comm
deepspeed.init_distributed(dist_backend="gloo")
print(json.dumps({"shm_op": ds_comm.cdb.shm_comm_op is not None}))
"""


def _start_backend(tmp_path: Path, mode: str) -> tuple[dict[str, bool], Path]:
    ext = tmp_path / f"ext-{mode}"
    env = dict(os.environ, DS_ACCELERATOR="cpu", TORCH_EXTENSIONS_DIR=str(ext),
               RANK="0", WORLD_SIZE="1", LOCAL_RANK="0")  # fmt: skip
    # The repository root on the path: `python -c` in a tmp cwd must still find the packages.
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[2])
    out = subprocess.run(
        [sys.executable, "-c", SCRIPT, mode, str(tmp_path / f"store-{mode}")],
        env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1]), ext


def test_the_comm_backend_starts_without_building_the_shm_op(tmp_path: Path) -> None:
    result, ext = _start_backend(tmp_path, "skip")
    assert result == {"shm_op": False}
    # Nothing was compiled: no build folder for the op under the extensions dir.
    assert not (ext / "deepspeed_shm_comm").exists()


def test_cpu_autocast_runs_the_forward_in_bf16_and_keeps_fp32_weights() -> None:
    import torch

    from train_loops.config import cpu_trainer
    from train_loops.engine import cpu_autocast

    if not torch.ops.mkldnn._is_mkldnn_bf16_supported():
        pytest.skip("this CPU has no native bf16")
    layer = torch.nn.Linear(8, 4)
    with cpu_autocast(cpu_trainer(cpu_autocast="bf16")):
        out = layer(torch.randn(2, 8))
    assert out.dtype == torch.bfloat16 and layer.weight.dtype == torch.float32
    out.float().sum().backward()
    assert layer.weight.grad is not None and layer.weight.grad.dtype == torch.float32
    with cpu_autocast(cpu_trainer()):
        assert layer(torch.randn(2, 8)).dtype == torch.float32


def test_cpu_autocast_falls_back_to_fp32_with_a_warning_without_native_bf16(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import torch

    from train_loops.config import cpu_trainer
    from train_loops.engine import cpu_autocast

    # The hardware probe is what this test replaces: a CPU without bf16.
    monkeypatch.setattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", lambda: False)
    with pytest.warns(UserWarning, match="no native bf16"):
        context = cpu_autocast(cpu_trainer(cpu_autocast="bf16"))
    with context:
        assert torch.nn.Linear(8, 4)(torch.randn(2, 8)).dtype == torch.float32


def test_cpu_autocast_is_refused_on_gpu_workers() -> None:
    from train_loops.config import TrainerConfig

    with pytest.raises(ValueError, match="cpu_autocast is for use_gpu=False"):
        TrainerConfig(use_gpu=True, cpu_autocast="bf16")
