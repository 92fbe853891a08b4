"""The bundled job configs validate; bad values fail naming the field; --help stays light."""

from __future__ import annotations

import subprocess
import sys

import pytest

from workflows.common.config_io import CONFIG_DIR, ConfigError, load_config
from workflows.online_rl.config import OnlineRLConfig

PROD_ENV = {
    "HF_CKPT": "/ckpt/policy",
    "ANALYZER_MODEL_PATH": "/ckpt/analyzer",
    "GUI_ENV_SERVER_URL": "http://env:8000",
    "GUI_TEST_CONFIG_BASE_DIR": "/osworld/evaluation_examples",
}


def test_embedded_default_is_cpu_sized() -> None:
    cfg = load_config(OnlineRLConfig, "embedded")
    assert (
        cfg.trainer.use_gpu is False and cfg.trainer.zero_stage == 2 and cfg.trainer.dtype == "fp32"
    )
    assert cfg.policy.model_path.startswith("warm:") and cfg.env.server_url is None
    assert cfg.analyzer.model_path == cfg.policy.model_path and cfg.policy.agent_style == "elements"
    assert cfg.policy.backend.type == "transformers"


def test_embedded_desktop_plays_the_built_in_desktop_tasks() -> None:
    from env_client.tasks.sources import make_task_source

    cfg = load_config(OnlineRLConfig, "embedded_desktop")
    assert cfg.env.embedded.backend == "desktop" and cfg.env.server_url is None
    source = make_task_source(cfg.task_source)
    train, test = source.tasks("train"), source.tasks("eval")
    assert len(train) + len(test) >= 24 and not {t["id"] for t in train} & {t["id"] for t in test}
    assert {t["kind"] for t in train} >= {"os", "text_editor", "libreoffice_calc"}


@pytest.mark.parametrize(
    ("config", "overrides", "says"),
    [
        ("embedded", ["task_source.kind=osworld", "task_source.path=/x",
                      "task_source.splits={train: t.json}"], "env.embedded.backend=desktop"),
        ("embedded_desktop", ["task_source.kind=miniwob", "task_source.path=null",
                              "task_source.splits={}"], "task_source.kind=osworld"),
    ],
)  # fmt: skip
def test_a_task_source_the_embedded_backend_cannot_play_is_refused(
    config: str, overrides: list[str], says: str
) -> None:
    with pytest.raises(ConfigError, match=says):
        load_config(OnlineRLConfig, config, overrides)


@pytest.mark.parametrize("name", ["production_qwen3vl", "production_evocua"])
def test_production_configs_carry_method_defaults(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    for k, v in PROD_ENV.items():
        monkeypatch.setenv(k, v)
    cfg = load_config(OnlineRLConfig, name)
    assert cfg.policy.model_path == "/ckpt/policy" and cfg.analyzer.model_path == "/ckpt/analyzer"
    assert cfg.env.server_url == "http://env:8000"
    assert (cfg.trainer.num_workers, cfg.trainer.zero_stage, cfg.trainer.dtype) == (8, 3, "bf16")
    assert (
        cfg.policy.num_replicas * cfg.policy.num_gpus
        + cfg.analyzer.num_replicas * cfg.analyzer.num_gpus
        == 8
    )
    assert (
        cfg.optim.lr == 1e-6
        and tuple(cfg.optim.betas) == (0.9, 0.95)
        and cfg.optim.weight_decay == 0.1
    )
    assert (cfg.loss.kl_coef, cfg.loss.sd_coef, cfg.loss.gate_beta, cfg.loss.clip_eps) == (
        0.01,
        0.01,
        5.0,
        0.2,
    )
    # The reference agents: Qwen3-VL replays 2 earlier steps (H=3) and answers in ≤ 1024
    # tokens; EvoCUA replays 3 (H=4) and may think for up to 32768.
    h, tokens = {"production_qwen3vl": (3, 1024), "production_evocua": (4, 32768)}[name]
    assert cfg.policy.agent_style == name.removeprefix("production_")
    assert cfg.rollout.group_size == 8 and cfg.rollout.pause_s == 0.5
    # The reference's schedule: one update per rollout batch of 4 groups, zero-gradient
    # samples dropped.
    assert (cfg.trainer.schedule, cfg.buffer.groups_per_batch) == ("rollout_batch", 4)
    assert cfg.buffer.drop_zero_gradient
    assert cfg.rollout.history_screens == h
    assert cfg.policy.sampling.max_new_tokens == tokens and cfg.policy.sampling.temperature == 1.0
    # The authors' launchers: OSWorld task files, trainer-recomputed ratio anchor, zero-gradient
    # samples dropped, no Entropulse (ComputerRL's, not ComputerSD's).
    src = cfg.task_source
    assert (src.kind, src.path) == ("osworld", "/osworld/evaluation_examples/examples")
    assert src.splits == {"train": "../train_nochrome.json", "eval": "../test_all.json"}
    assert cfg.loss.ratio_anchor == "recomputed" and cfg.buffer.drop_zero_gradient
    assert cfg.entropulse.enabled is False
    assert cfg.rollout.max_groups == 800  # NUM_ROLLOUT=200 batches of 4 tasks


def test_production_config_without_env_names_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HF_CKPT", raising=False)
    with pytest.raises(ConfigError, match="HF_CKPT is not set"):
        load_config(OnlineRLConfig, "production_qwen3vl")


@pytest.mark.parametrize(
    ("override", "expected"),
    [
        (
            "rollout.group_size=1",
            r"rollout\.group_size = 1: Input should be greater than or equal to 2",
        ),
        ("mode=fast", r"mode = 'fast': Input should be 'async' or 'sync'"),
        ("trainer.zero_stage=3", "zero_stage=3 needs GPUs"),
        (
            "buffer.capacity_samples=4",
            "buffer.capacity_samples=4 is smaller than trainer.samples_per_step=8",
        ),
        ("policy.model_pth=x", r"policy\.model_pth: unknown field"),
    ],
)
def test_bad_overrides_fail_clearly(override: str, expected: str) -> None:
    with pytest.raises(ConfigError, match=expected):
        load_config(OnlineRLConfig, "embedded", [override])


@pytest.mark.parametrize(
    ("overrides", "says"),
    [
        (["trainer.updates_per_batch=2"], "updates_per_batch=2 needs schedule='rollout_batch'"),
        (["trainer.updates_per_batch=2", "trainer.schedule=rollout_batch",
          "loss.ratio_anchor=recomputed"], "needs loss.ratio_anchor='behaviour'"),
    ],
)  # fmt: skip
def test_several_updates_per_batch_need_a_batch_and_a_fixed_anchor(
    overrides: list[str], says: str
) -> None:
    with pytest.raises(ConfigError, match=says):
        load_config(OnlineRLConfig, "embedded", overrides)
    ok = ["trainer.updates_per_batch=2", "trainer.schedule=rollout_batch"]
    assert load_config(OnlineRLConfig, "embedded", ok).trainer.updates_per_batch == 2


def test_every_bundled_file_has_a_header_comment() -> None:
    for path in CONFIG_DIR.glob("*.yaml"):
        assert path.read_text().startswith("#"), path


def test_help_imports_no_heavy_modules() -> None:
    code = (
        "import sys, contextlib, io\n"
        "from workflows.online_rl import cli as online_rl\n"
        "with contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(SystemExit):\n"
        "    online_rl.main(['--help'])\n"
        "heavy = [m for m in ('torch', 'ray', 'transformers', 'deepspeed') if m in sys.modules]\n"
        "print(','.join(heavy))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "", f"--help imported {out.stdout.strip()}"
