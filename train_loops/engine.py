"""DeepSpeed on a Ray Train worker: config, engine, reference model, full-weight gathering.

DeepSpeed is imported inside the functions (never at module top: importing it on a CPU-only
driver has broken drivers before). Ray Train has already initialized ``torch.distributed``
(gloo on CPU, NCCL on GPU); DeepSpeed reuses that process group.
"""

from __future__ import annotations

import os
import sys
import warnings
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import Any

import torch

from train_loops.config import OptimConfig, TrainerConfig

TORCH_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
# The op DeepSpeed's CPU accelerator JIT-compiles when its comm backend starts.
SHM_COMM_OP = "deepspeed_shm_comm"


def cpu_op_env() -> None:
    """Where and how DeepSpeed's CPU ops are JIT-built (caller's settings win), should one be.

    Per interpreter prefix (the virtualenv): torch keys its build cache on the include paths, so
    two checkouts sharing ``~/.cache/torch_extensions`` rebuild over each other's op on every
    switch. Always the virtualenv's ninja (a DeepSpeed dependency) first on PATH: Debian's
    ninja 1.11 and pip's 1.13 each take the other's build log as stale. One compiler at a time:
    two parallel ``cc1plus`` took 3 GiB, a third of the embedded job's memory budget.
    """
    os.environ.setdefault("TORCH_EXTENSIONS_DIR", str(Path(sys.prefix) / "torch_extensions"))
    os.environ.setdefault("MAX_JOBS", "1")
    bin_dir = str(Path(sys.executable).parent)
    path = os.environ.get("PATH", "")
    if (Path(bin_dir) / "ninja").exists() and path.split(os.pathsep)[0] != bin_dir:
        os.environ["PATH"] = bin_dir + os.pathsep + path


def skip_shm_comm_op() -> None:
    """Keep DeepSpeed's comm backend from compiling its shared-memory op in this process.

    On the CPU accelerator every comm backend start compiles ``deepspeed_shm_comm`` (about a
    minute and 1.5 GiB on 2 cores, once per virtualenv) and uses it only for
    ``inference_all_reduce``, the tensor-parallel inference path; training reduces through
    ``torch.distributed`` (gloo) either way. DeepSpeed keeps its op compatibility table as one
    module-level dict that it reads at that start, so marking the op unavailable there is
    enough. Call before ``deepspeed.initialize``.
    """
    import deepspeed.ops

    deepspeed.ops.__compatible_ops__[SHM_COMM_OP] = False


def cpu_autocast(trainer: TrainerConfig) -> AbstractContextManager[Any]:
    """The context a micro-step's forward and backward run in: bf16 autocast on CPU when
    ``trainer.cpu_autocast`` asks for it and the CPU computes bf16 natively, else nothing
    (oneDNN emulates bf16 on older CPUs, slower than fp32)."""
    if trainer.cpu_autocast == "off":
        return nullcontext()
    if not torch.ops.mkldnn._is_mkldnn_bf16_supported():
        warnings.warn(
            "trainer.cpu_autocast='bf16': this CPU has no native bf16, training in fp32",
            stacklevel=2,
        )
        return nullcontext()
    return torch.autocast("cpu", dtype=torch.bfloat16)


def ds_config(trainer: TrainerConfig, optim: OptimConfig | None) -> dict[str, Any]:
    """The DeepSpeed config dict for ``trainer``'s layout; ``optim=None`` for inference only."""
    zero: dict[str, Any] = {"stage": trainer.zero_stage}
    if trainer.zero_stage == 3:
        zero["stage3_gather_16bit_weights_on_model_save"] = True
    cfg: dict[str, Any] = {
        "train_batch_size": trainer.samples_per_step,
        "train_micro_batch_size_per_gpu": trainer.micro_batch_size,
        "gradient_accumulation_steps": trainer.grad_accum_steps,
        "zero_optimization": zero,
        "bf16": {"enabled": trainer.dtype == "bf16"},
        "steps_per_print": 10**9,
        "wall_clock_breakdown": False,
    }
    if optim is not None:
        cfg["optimizer"] = {
            "type": "AdamW",
            "params": {
                "lr": optim.lr,
                "betas": list(optim.betas),
                "eps": optim.eps,
                "weight_decay": optim.weight_decay,
                "torch_adam": True,
            },
        }
        # Always explicit: DeepSpeed clips at 1.0 when the key is absent (0 disables).
        cfg["gradient_clipping"] = optim.grad_clip if optim.grad_clip is not None else 0.0
    return cfg


def param_groups(model: torch.nn.Module, weight_decay: float) -> list[dict[str, Any]]:
    """AdamW groups: decay on matrices, none on biases and norm weights (1-D tensors)."""
    decay: list[torch.nn.Parameter] = []
    no_decay: list[torch.nn.Parameter] = []
    for param in model.parameters():
        if param.requires_grad:
            (decay if param.ndim >= 2 else no_decay).append(param)
    groups = [{"params": decay, "weight_decay": weight_decay}]
    if no_decay:
        groups.append({"params": no_decay, "weight_decay": 0.0})
    return groups


def load_model(path: str, trainer: TrainerConfig, trainable: bool = True) -> torch.nn.Module:
    """A Hugging Face image-text-to-text model from ``path`` in the trainer's dtype."""
    from transformers import AutoModelForImageTextToText

    model = AutoModelForImageTextToText.from_pretrained(path, dtype=TORCH_DTYPES[trainer.dtype])
    model.config.use_cache = False
    if trainable:
        model.train()
        if trainer.gradient_checkpointing:
            model.gradient_checkpointing_enable(
                gradient_checkpointing_kwargs={"use_reentrant": False}
            )
    else:
        model.eval()
        model.requires_grad_(False)
    return model


def init_engine(model: torch.nn.Module, trainer: TrainerConfig, optim: OptimConfig) -> Any:
    """``deepspeed.initialize`` of the policy with AdamW; returns the engine."""
    import deepspeed

    engine, *_ = deepspeed.initialize(
        model=model,
        model_parameters=param_groups(model, optim.weight_decay),
        config=ds_config(trainer, optim),
    )
    return engine


def init_reference(model: torch.nn.Module, trainer: TrainerConfig, device: Any) -> Any:
    """The frozen reference: partitioned by DeepSpeed under ZeRO-3, else a plain module."""
    if trainer.zero_stage != 3:
        return model.to(device)
    import deepspeed

    engine, *_ = deepspeed.initialize(model=model, config=ds_config(trainer, None))
    engine.eval()
    return engine


def full_state_dict(engine: Any, zero_stage: int, rank: int) -> dict[str, torch.Tensor] | None:
    """Full CPU weights on rank 0 (fresh copies), None elsewhere.

    Under ZeRO-3 the parameters are gathered layer by layer, which every rank must join; under
    ZeRO ≤ 2 every rank already holds the full parameters and only rank 0 copies them.
    """
    if zero_stage == 3:
        # Public DeepSpeed helper despite the underscore (HF Accelerate uses it): already
        # fresh CPU tensors on rank 0.
        return engine._zero3_consolidated_16bit_state_dict()
    if rank != 0:
        return None
    return {k: v.detach().to("cpu", copy=True) for k, v in engine.module.state_dict().items()}
