"""vLLM worker extension for weight hot-swap (``worker_extension_cls``), as in vLLM's RLHF
examples: vLLM mixes this class into each GPU worker, and the backend reaches it through
``engine.collective_rpc("csd_load_weights", args=(bucket,))``. The tensors carry Hugging Face
names; the model's own ``load_weights`` maps them to vLLM's fused/sharded parameters.

Imported only inside vLLM worker processes (never by tests without vLLM).
"""

from __future__ import annotations

from typing import Any

import torch


class CsdWeightLoader:
    """Methods added to vLLM's worker; ``self.model_runner``, ``self.device`` and
    ``self.model_config`` are the worker's own attributes."""

    model_runner: Any
    device: Any
    model_config: Any

    def _csd_model(self) -> Any:
        """The worker's model, unwrapped (``Worker.get_model``; CUDA-graph wrappers hide
        ``load_weights`` behind ``model_runner.model``)."""
        get_model = getattr(self, "get_model", None)
        return get_model() if callable(get_model) else self.model_runner.model

    def csd_load_weights(self, named: list[tuple[str, torch.Tensor]]) -> int:
        """Load one bucket of HF-named tensors (CPU) into the model on this worker."""
        model = self._csd_model()
        model.load_weights(weights=((n, t.to(self.device, non_blocking=True)) for n, t in named))
        torch.cuda.synchronize()
        return len(named)

    def csd_finish_weights(self) -> None:
        """Post-load processing vLLM applies after a checkpoint load (quantization repacking
        etc.; a no-op for plain bf16 weights)."""
        from vllm.model_executor.model_loader.utils import process_weights_after_loading

        process_weights_after_loading(self._csd_model(), self.model_config, self.device)
        torch.cuda.synchronize()
