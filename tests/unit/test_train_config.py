"""train_loops.config: production defaults, bounds, cross-field checks, light imports."""

from __future__ import annotations

import subprocess
import sys

import pytest
from pydantic import ValidationError

from train_loops.config import (
    LossConfig,
    OptimConfig,
    RLTrainConfig,
    SFTTrainConfig,
    TrainerConfig,
    cpu_trainer,
)


def test_defaults_are_method_production_defaults() -> None:
    loss, optim, trainer = LossConfig(), OptimConfig(), TrainerConfig()
    assert (loss.clip_eps, loss.clip_eps_high, loss.kl_coef) == (0.2, 0.2, 0.01)
    assert (loss.sd_type, loss.sd_coef, loss.gate_beta, loss.tis_cap) == ("gated", 0.01, 5.0, None)
    assert (optim.lr, optim.betas, optim.weight_decay) == (1e-6, (0.9, 0.95), 0.1)
    layout = (trainer.num_workers, trainer.use_gpu, trainer.zero_stage, trainer.dtype)
    assert layout == (8, True, 3, "bf16")
    assert loss.uses_reference


def test_cpu_trainer_layout() -> None:
    t = cpu_trainer(max_steps=5)
    layout = (t.num_workers, t.use_gpu, t.zero_stage, t.dtype, t.max_steps)
    assert layout == (2, False, 2, "fp32", 5)
    assert t.samples_per_worker == 4 and t.grad_accum_steps == 2


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"samples_per_step": 6, "num_workers": 2, "micro_batch_size": 2}, "multiple of"),
        ({"use_gpu": False, "zero_stage": 3, "dtype": "fp32"}, "zero_stage=3 needs GPUs"),
        ({"use_gpu": False, "zero_stage": 2, "dtype": "bf16"}, "fp32"),
        ({"zero_stage": 4}, "zero_stage"),
        ({"max_steps": 0}, "max_steps"),
        ({"learning_rate": 1.0}, "learning_rate"),
    ],
)
def test_trainer_config_rejects(kwargs: dict, message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        TrainerConfig(**kwargs)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"sd_type": "soft"}, "sd_type"),
        ({"sd_coef": 0.0}, "sd_type='off'"),
        ({"tis_cap": 0.5, "ratio_anchor": "recomputed"}, "tis_cap"),
        ({"tis_cap": 2.0}, "needs ratio_anchor='recomputed'"),
        ({"ratio_anchor": "engine"}, "ratio_anchor"),
        ({"clip_eps": 1.0}, "clip_eps"),
        ({"kl_coef": -0.1}, "kl_coef"),
    ],
)
def test_loss_config_rejects(kwargs: dict, message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        LossConfig(**kwargs)


def test_loss_config_off_and_no_kl() -> None:
    cfg = LossConfig(sd_type="off", sd_coef=0.0, kl_coef=0.0)
    assert not cfg.uses_reference


def test_optim_config_rejects_betas_out_of_range() -> None:
    with pytest.raises(ValidationError, match="betas"):
        OptimConfig(betas=(0.9, 1.0))


def test_composed_configs_round_trip_through_json() -> None:
    cfg = RLTrainConfig(trainer=cpu_trainer(), loss=LossConfig(sd_type="hard"))
    assert RLTrainConfig.model_validate_json(cfg.model_dump_json()) == cfg
    assert SFTTrainConfig().optim.lr == 1e-5


def test_config_module_imports_neither_torch_nor_ray() -> None:
    code = (
        "import sys, train_loops.config; "
        "bad = [m for m in ('torch', 'ray', 'deepspeed', 'transformers') if m in sys.modules]; "
        "assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
