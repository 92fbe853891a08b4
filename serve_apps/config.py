"""Configs of the Serve applications: policy, analyzer, inference backends, weight sync.

Pydantic only (no torch, no ray), so builders, ``serve run`` argument checks and the rollout side
load fast. ``serve run serve_apps.policy:build_app model_path=/ckpt num_replicas=2`` validates
its ``key=value`` arguments against :class:`PolicyAppConfig`; nested sections (``backend``,
``sampling``, ``weights``, ``batching``) also accept a JSON string there, e.g.
``backend='{"type": "vllm"}'``.

Two worked examples close the module: :func:`tiny_cpu_example` (the embedded default: tiny
models on a 2-core laptop) and :func:`production_16gpu_example` (8 of 16 GPUs serve: 6 policy
replicas on vLLM, 4 analyzer replicas sharing 2 GPUs).
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator


class _Config(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    @model_validator(mode="before")
    @classmethod
    def _json_sections(cls, data: Any) -> Any:
        """Accept JSON strings for nested sections (``serve run`` passes strings)."""
        if not isinstance(data, dict):
            return data
        out = dict(data)
        for key, value in data.items():
            field = cls.model_fields.get(key)
            if field is None or not isinstance(value, str) or not value.lstrip().startswith("{"):
                continue
            try:
                out[key] = json.loads(value)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{key}: not valid JSON ({exc.msg}): {value!r}") from None
        return out


class SamplingConfig(_Config):
    """Default sampling of a deployment; each request may override any field."""

    temperature: float = Field(
        1.0, ge=0.0, le=10.0, description="Softmax temperature; 0 means greedy decoding."
    )
    top_p: float = Field(1.0, gt=0.0, le=1.0, description="Nucleus sampling mass; 1 disables it.")
    max_new_tokens: int = Field(
        1024, ge=1, le=32768, description="Most tokens generated per response (METHOD: 1024)."
    )
    seed: int | None = Field(
        None, ge=0, description="Seed for reproducible sampling; None draws fresh randomness."
    )


class TransformersBackendConfig(_Config):
    """Hugging Face transformers backend: CPU default, also runs on one GPU."""

    type: Literal["transformers"] = "transformers"
    device: Literal["auto", "cpu", "cuda"] = Field(
        "auto", description="Where the model runs; auto = cuda when the replica has a GPU."
    )
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = Field(
        "auto", description="Weights dtype; auto = float32 on CPU, bfloat16 on GPU."
    )
    double_buffer: bool = Field(
        True,
        description="Keep a standby copy of the model and load new weights into it, so requests "
        "never wait for a swap (2x model memory). False: drain requests and load in place.",
    )
    torch_threads: int | None = Field(
        None, ge=1, description="torch intra-op threads in the replica; None keeps torch's choice."
    )
    attn_implementation: Literal["sdpa", "eager", "flash_attention_2"] | None = Field(
        None,
        description="Attention kernel passed to from_pretrained; None = transformers' default.",
    )


class VLLMBackendConfig(_Config):
    """vLLM backend (GPU only; ``pip install .[gpu]``). Imported lazily by the replica."""

    type: Literal["vllm"] = "vllm"
    dtype: Literal["auto", "bfloat16", "float16", "float32"] = Field(
        "bfloat16", description="Weights dtype (float32 for exact comparisons in tests)."
    )
    tensor_parallel_size: int = Field(1, ge=1, le=8, description="GPUs per engine (TP).")
    gpu_memory_utilization: float = Field(
        0.85, gt=0.05, le=0.98, description="Fraction of a device's memory vLLM may take."
    )
    max_model_len: int = Field(16384, ge=256, description="Context length (prompt + response).")
    max_num_seqs: int = Field(64, ge=1, description="Sequences the engine schedules at once.")
    enable_prefix_caching: bool = Field(
        True, description="Share KV of common prefixes; reset on every weight swap."
    )
    enforce_eager: bool = Field(False, description="Disable CUDA graphs (faster start, slower).")
    max_images_per_prompt: int = Field(4, ge=1, description="vLLM limit_mm_per_prompt['image'].")
    weight_bucket_mb: int = Field(
        512, ge=16, description="Size of each batch of tensors sent to the engine on a swap."
    )
    seed: int = Field(0, ge=0, description="Engine seed.")


BackendConfig = Annotated[
    TransformersBackendConfig | VLLMBackendConfig, Field(discriminator="type")
]


class BatchingConfig(_Config):
    """How concurrent requests are grouped into one model call (``@serve.batch``)."""

    max_batch_size: int = Field(8, ge=1, le=256, description="Most requests per model call.")
    batch_wait_timeout_s: float = Field(
        0.005, ge=0.0, le=1.0, description="How long a partial batch waits for more requests."
    )


class WeightSyncConfig(_Config):
    """Replicas follow a weight registry (a named actor) and load each new version themselves."""

    enabled: bool = Field(True, description="Follow the registry; off for frozen models.")
    registry_name: str = Field(
        "policy", min_length=1, description="Registry actor name; publishers use the same name."
    )
    namespace: str = Field("computersd", min_length=1, description="Ray namespace of the registry.")
    initial_version: int = Field(0, ge=0, description="Version of the checkpoint at model_path.")
    poll_interval_s: float = Field(
        2.0,
        gt=0.0,
        le=60.0,
        description="Long-poll timeout: a new version arrives at once; this bounds the heartbeat.",
    )
    stale_after_s: float = Field(
        30.0, gt=0.0, description="A replica silent this long is left out of version reports."
    )
    load_timeout_s: float = Field(600.0, gt=0.0, description="Most time for fetching one version.")


class _ServerConfig(_Config):
    """Fields shared by the policy and the analyzer deployments."""

    model_path: str = Field(
        ..., min_length=1, description="Local Hugging Face checkpoint folder (never downloaded)."
    )
    served_model_name: str | None = Field(
        None, description="Model id on the OpenAI endpoint; None = the app name."
    )
    num_replicas: int = Field(1, ge=1, le=256, description="Serve replicas.")
    num_cpus: float = Field(0.5, ge=0.0, description="CPUs reserved per replica (fractions ok).")
    num_gpus: float = Field(0.0, ge=0.0, le=8.0, description="GPUs per replica (fractions ok).")
    max_ongoing_requests: int = Field(32, ge=1, description="Concurrent requests per replica.")
    backend: BackendConfig = Field(
        default_factory=TransformersBackendConfig, description="Inference engine, by `type`."
    )
    sampling: SamplingConfig = Field(default_factory=SamplingConfig)
    batching: BatchingConfig = Field(default_factory=BatchingConfig)
    max_prompt_tokens: int = Field(
        8192, ge=16, description="Longest prompt accepted (image pads included); longer is a 400."
    )
    max_images: int = Field(8, ge=0, description="Most images per request.")
    max_image_bytes: int = Field(8 << 20, ge=1024, description="Largest encoded image accepted.")
    max_image_pixels: int = Field(
        4096 * 4096, ge=64, description="Largest decoded image (width*height) accepted."
    )
    max_body_bytes: int = Field(
        64 << 20,
        ge=1024,
        description="Largest HTTP request body of the OpenAI endpoint; a longer one is refused "
        "with 413 before it is parsed (images travel base64-encoded: 4/3 of their bytes).",
    )

    @model_validator(mode="after")
    def _check_devices(self) -> _ServerConfig:
        if isinstance(self.backend, VLLMBackendConfig):
            if self.num_gpus <= 0:
                raise ValueError("backend.type='vllm' needs num_gpus > 0 (vLLM runs on GPUs only)")
            needed = self.backend.tensor_parallel_size
            if needed > 1 and self.num_gpus < needed:
                raise ValueError(
                    f"tensor_parallel_size={needed} needs num_gpus >= {needed}, got {self.num_gpus}"
                )
            if self.num_gpus < 1 and self.backend.gpu_memory_utilization > self.num_gpus:
                raise ValueError(
                    f"replicas share a GPU (num_gpus={self.num_gpus}) but each may take "
                    f"gpu_memory_utilization={self.backend.gpu_memory_utilization} of it; "
                    f"set it to at most {self.num_gpus}"
                )
        if (
            isinstance(self.backend, TransformersBackendConfig)
            and self.backend.device == "cuda"
            and self.num_gpus <= 0
        ):
            raise ValueError("backend.device='cuda' needs num_gpus > 0")
        return self

    @field_validator("model_path")
    @classmethod
    def _no_hub_ids(cls, value: str) -> str:
        if value.startswith(("http://", "https://", "hf://")):
            raise ValueError(f"model_path must be a local folder, got {value!r}")
        return value


class PolicyAppConfig(_ServerConfig):
    """The policy deployment: generate, score, OpenAI chat endpoint, weight hot-swap."""

    name: str = Field("policy", min_length=1, description="Serve application/deployment name.")
    route_prefix: str = Field("/policy", description="HTTP prefix; OpenAI base = prefix + '/v1'.")
    weights: WeightSyncConfig = Field(default_factory=WeightSyncConfig)
    agent_style: Literal["toolcall", "elements", "qwen3vl", "evocua"] = Field(
        "toolcall",
        description="The prompt/answer format the checkpoint was trained on "
        "(serve_apps.prompting.styles): toolcall (METHOD.md §1), elements (tiny models), "
        "qwen3vl (Qwen3-VL's computer_use prompt) or evocua (EvoCUA's), as the reference agents.",
    )

    @field_validator("route_prefix")
    @classmethod
    def _slash(cls, value: str) -> str:
        if not value.startswith("/"):
            raise ValueError(f"route_prefix must start with '/', got {value!r}")
        return value


class AnalyzerAppConfig(_ServerConfig):
    """The GUI analyzer deployment: judges a transition (METHOD.md §2), k votes."""

    name: str = Field("analyzer", min_length=1, description="Serve application/deployment name.")
    route_prefix: str = Field("/analyzer", description="HTTP prefix of its OpenAI endpoint.")
    votes: int = Field(1, ge=1, le=15, description="Judgments sampled per transition (k).")
    sampling: SamplingConfig = Field(
        default_factory=lambda: SamplingConfig(temperature=0.0, max_new_tokens=256),
        description="Greedy by default; k > 1 votes need temperature > 0.",
    )
    weights: WeightSyncConfig = Field(
        default_factory=lambda: WeightSyncConfig(enabled=False, registry_name="analyzer"),
        description="The analyzer is frozen during RL; enable to follow a registry anyway.",
    )
    full_system_prompt: bool = Field(
        True,
        description="compact prompt: the detailed analyzer instructions (False: a one-line "
        "version); minimal has none, reference its own.",
    )
    prompt_style: Literal["compact", "minimal", "reference"] = Field(
        "compact",
        description="compact: screens before/after + one-line action summaries; minimal: the "
        "same without instructions and with short labels, half the tokens (the embedded warm "
        "start's analyzer is trained on it); reference: the reference analyzer's request, "
        "with the history screenshots and the policy's full earlier responses (production).",
    )

    fault_rate: float = Field(
        0.0,
        ge=0.0,
        le=1.0,
        description="Testing switch: this fraction of analyze requests fail (a seeded draw per "
        "replica) so that callers' error handling runs for real; 0 in every real run.",
    )

    @field_validator("route_prefix")
    @classmethod
    def _slash(cls, value: str) -> str:
        if not value.startswith("/"):
            raise ValueError(f"route_prefix must start with '/', got {value!r}")
        return value

    @model_validator(mode="after")
    def _votes_need_sampling(self) -> AnalyzerAppConfig:
        if self.votes > 1 and self.sampling.temperature == 0.0:
            raise ValueError(
                f"votes={self.votes} with temperature=0 gives {self.votes} identical votes; "
                "set sampling.temperature > 0 or votes=1"
            )
        return self


class ServeAppsConfig(_Config):
    """Both deployments of the online RL job."""

    policy: PolicyAppConfig
    analyzer: AnalyzerAppConfig


def tiny_cpu_example(policy_path: str, analyzer_path: str) -> ServeAppsConfig:
    """Embedded default: tiny models, one CPU replica each, short responses (2-core laptop)."""
    return ServeAppsConfig(
        policy=PolicyAppConfig(
            model_path=policy_path,
            num_replicas=1,
            num_cpus=0.5,
            sampling=SamplingConfig(max_new_tokens=48),
            batching=BatchingConfig(max_batch_size=8, batch_wait_timeout_s=0.005),
            max_prompt_tokens=2048,
        ),
        analyzer=AnalyzerAppConfig(
            model_path=analyzer_path,
            num_replicas=1,
            num_cpus=0.5,
            sampling=SamplingConfig(temperature=0.0, max_new_tokens=64),
            full_system_prompt=False,
            max_prompt_tokens=2048,
        ),
    )


def production_16gpu_example(policy_path: str, analyzer_path: str) -> ServeAppsConfig:
    """16 GPUs, 8 of which serve: 6 policy replicas (1 GPU each, vLLM) and 4 analyzer replicas
    sharing 2 GPUs (0.5 each). METHOD.md defaults: temperature 1, top-p 1, 1024 new tokens; the
    analyzer as the reference's (its request style, greedy, up to 4096 answer tokens)."""
    return ServeAppsConfig(
        policy=PolicyAppConfig(
            model_path=policy_path,
            num_replicas=6,
            num_cpus=4,
            num_gpus=1.0,
            max_ongoing_requests=128,
            backend=VLLMBackendConfig(gpu_memory_utilization=0.85, max_model_len=16384),
            sampling=SamplingConfig(temperature=1.0, top_p=1.0, max_new_tokens=1024),
            batching=BatchingConfig(max_batch_size=32, batch_wait_timeout_s=0.01),
            max_prompt_tokens=15360,
            weights=WeightSyncConfig(registry_name="policy", poll_interval_s=2.0),
        ),
        analyzer=AnalyzerAppConfig(
            model_path=analyzer_path,
            num_replicas=4,
            num_cpus=2,
            num_gpus=0.5,
            max_ongoing_requests=64,
            backend=VLLMBackendConfig(gpu_memory_utilization=0.42, max_model_len=16384),
            sampling=SamplingConfig(temperature=0.0, max_new_tokens=4096),
            max_prompt_tokens=12288,
            prompt_style="reference",
        ),
    )
