"""Inference backends behind one interface (:class:`~serve_apps.backends.base.InferenceBackend`):
transformers (CPU default, GPU too) and vLLM (GPU; imported only when configured)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from serve_apps.config import BackendConfig, TransformersBackendConfig, VLLMBackendConfig

if TYPE_CHECKING:
    from serve_apps.backends.base import InferenceBackend
    from serve_apps.prompting.inputs import PromptEncoder


def make_backend(
    cfg: BackendConfig, model_path: str, encoder: PromptEncoder, version: int
) -> InferenceBackend:
    """Build the configured backend (loads the model; call it off the event loop)."""
    if isinstance(cfg, TransformersBackendConfig):
        from serve_apps.backends.transformers_backend import TransformersBackend

        return TransformersBackend(cfg, model_path, encoder, version)
    if isinstance(cfg, VLLMBackendConfig):
        from serve_apps.backends.vllm_backend import VLLMBackend

        return VLLMBackend(cfg, model_path, encoder, version)
    raise TypeError(f"unknown backend config {type(cfg).__name__}")
