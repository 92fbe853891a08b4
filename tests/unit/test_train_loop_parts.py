"""The trainer's plumbing without Ray: resume decisions, processor files, metrics, row stream."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import pyarrow as pa
import pytest

from train_loops.checkpoint import (
    DEEPSPEED_DIR,
    TrainerState,
    checkpoint_complete,
    copy_processor_files,
    newest_of,
    resolve_start,
    write_manifest,
)
from train_loops.config import OptimConfig, TrainerConfig, cpu_trainer
from train_loops.engine import ds_config, param_groups
from train_loops.jsonl import JsonlWriter
from train_loops.metrics import mean_of, reduce_across_ranks, staleness
from train_loops.stream import RowStream, agree, any_rank

BASE = TrainerState(kind="rl", world_size=2, zero_stage=2, base_model="/base")


def _checkpoint(tmp_path: Path, with_ds: bool = True, **state) -> Path:
    folder = tmp_path / "ckpt"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    saved = TrainerState(**{**asdict(BASE), "step": 7, "version": 5, "samples_seen": 56, **state})
    saved.write(folder)
    if with_ds:
        (folder / DEEPSPEED_DIR).mkdir()
    return folder


def test_fresh_start_uses_the_base_model() -> None:
    start = resolve_start(None, BASE, "/base")
    assert (start.weights, start.state.step, start.state.version) == ("/base", 0, 0)
    assert start.optimizer_dir is None


def test_full_resume_from_a_checkpoint_of_the_same_kind_and_layout(tmp_path: Path) -> None:
    folder = _checkpoint(tmp_path)
    start = resolve_start(folder, BASE, "/base")
    assert start.weights == str(folder)
    assert (start.state.step, start.state.version, start.state.samples_seen) == (7, 5, 56)
    assert start.optimizer_dir == folder / DEEPSPEED_DIR


def test_resume_keeps_the_original_model_as_kl_reference(tmp_path: Path) -> None:
    start = resolve_start(_checkpoint(tmp_path, base_model="/orig"), BASE, "/elsewhere")
    assert start.state.base_model == "/orig"


def test_trainer_state_ignores_unknown_fields(tmp_path: Path) -> None:
    (tmp_path / "trainer_state.json").write_text(json.dumps({"kind": "sft", "step": 2, "x": 1}))
    state = TrainerState.read(tmp_path)
    assert state is not None and (state.kind, state.step) == ("sft", 2)


def test_other_world_size_keeps_counters_but_not_optimizer(tmp_path: Path) -> None:
    start = resolve_start(_checkpoint(tmp_path, world_size=4), BASE, "/base")
    assert (start.state.step, start.state.version) == (7, 5)
    assert start.optimizer_dir is None
    assert start.state.world_size == 2


def test_other_kind_is_a_new_phase_that_keeps_the_version(tmp_path: Path) -> None:
    start = resolve_start(_checkpoint(tmp_path, kind="sft"), BASE, "/base")
    assert (start.state.kind, start.state.step, start.state.version) == ("rl", 0, 5)
    assert start.optimizer_dir is None and start.weights.endswith("ckpt")


def test_other_kind_keeps_the_callers_step_count(tmp_path: Path) -> None:
    """RL after an Entropulse SFT phase counts its steps on from the job's RL step."""
    base = TrainerState(**{**asdict(BASE), "step": 4})
    start = resolve_start(_checkpoint(tmp_path, kind="sft"), base, "/base")
    assert (start.state.step, start.state.version) == (4, 5)


def test_plain_hugging_face_folder_gives_weights_only(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{}")
    start = resolve_start(tmp_path, BASE, "/base")
    assert (start.weights, start.state.step, start.state.version) == (str(tmp_path), 0, 0)
    assert start.optimizer_dir is None


def _saved(folder: Path, kind: str, step: int) -> Path:
    folder.mkdir()
    TrainerState(kind=kind, step=step).write(folder)
    return folder


def test_newest_of_prefers_a_further_checkpoint_of_the_same_kind(tmp_path: Path) -> None:
    # Ray Train's snapshot says step 2; the job found the step-4 folder written before a kill.
    own, given = _saved(tmp_path / "c2", "rl", 2), _saved(tmp_path / "c4", "rl", 4)
    assert newest_of(own, given, "rl") == given
    assert newest_of(given, own, "rl") == given


def test_newest_of_keeps_the_runs_own_checkpoint_over_another_kind(tmp_path: Path) -> None:
    # An RL segment restarted after a phase: its own checkpoint wins over the SFT weights.
    own, sft = _saved(tmp_path / "rl", "rl", 6), _saved(tmp_path / "sft", "sft", 9)
    assert newest_of(own, sft, "rl") == own


def test_newest_of_with_one_or_no_candidate(tmp_path: Path) -> None:
    only = _saved(tmp_path / "c", "rl", 1)
    assert newest_of(None, only, "rl") == only
    assert newest_of(only, None, "rl") == only
    assert newest_of(None, None, "rl") is None
    # A plain Hugging Face folder (no trainer state) never displaces the run's own checkpoint.
    plain = tmp_path / "hf"
    plain.mkdir()
    assert newest_of(only, plain, "rl") == only


def test_manifests_tell_a_whole_checkpoint_from_a_partial_copy(tmp_path: Path) -> None:
    # Each rank wrote its share into its own folder; storage merges them into one.
    shares = {}
    for rank in (0, 1):
        share = tmp_path / f"rank{rank}"
        (share / DEEPSPEED_DIR).mkdir(parents=True)
        if rank == 0:
            TrainerState(kind="rl", step=2, world_size=2).write(share)
            (share / "model.safetensors").write_bytes(b"w" * 100)
        (share / DEEPSPEED_DIR / f"optim_{rank}.pt").write_bytes(b"o" * 50)
        write_manifest(share, rank)
        shares[rank] = share
    merged = tmp_path / "merged"
    merged.mkdir()
    assert not checkpoint_complete(merged)  # nothing copied yet
    for share in shares.values():
        for f in share.rglob("*"):
            if f.is_file():
                (merged / f.relative_to(share)).parent.mkdir(parents=True, exist_ok=True)
                (merged / f.relative_to(share)).write_bytes(f.read_bytes())
    assert checkpoint_complete(merged)
    (merged / "model.safetensors").write_bytes(b"w" * 99)  # truncated copy
    assert not checkpoint_complete(merged)
    (merged / "model.safetensors").write_bytes(b"w" * 100)
    (merged / DEEPSPEED_DIR / "optim_1.pt").unlink()  # rank 1's shard missing
    assert not checkpoint_complete(merged)


def test_copy_processor_files_skips_weights_and_configs(tmp_path: Path) -> None:
    src, out = tmp_path / "src", tmp_path / "out"
    src.mkdir()
    out.mkdir()
    names = [
        "config.json", "generation_config.json", "model.safetensors", "trainer_state.json",
        "model.safetensors.index.json", "tokenizer.json", "tokenizer_config.json",
        "processor_config.json", "chat_template.jinja",
    ]  # fmt: skip
    for name in names:
        (src / name).write_text("x")
    (src / "deepspeed").mkdir()
    copied = copy_processor_files(src, out)
    assert copied == sorted(
        ["chat_template.jinja", "processor_config.json", "tokenizer.json", "tokenizer_config.json"]
    )


def test_deepspeed_config_matches_the_trainer_layout() -> None:
    cfg = ds_config(cpu_trainer(samples_per_step=8, micro_batch_size=2), OptimConfig(lr=1e-4))
    assert (cfg["train_batch_size"], cfg["train_micro_batch_size_per_gpu"]) == (8, 2)
    assert cfg["gradient_accumulation_steps"] == 2
    assert cfg["zero_optimization"]["stage"] == 2 and not cfg["bf16"]["enabled"]
    assert cfg["optimizer"]["params"]["torch_adam"] is True
    assert cfg["optimizer"]["params"]["betas"] == [0.9, 0.95]
    assert cfg["gradient_clipping"] == 1.0
    # No clip means 0 in DeepSpeed's terms: an absent key would clip at its default, 1.0.
    unclipped = ds_config(cpu_trainer(), OptimConfig(grad_clip=None))
    assert unclipped["gradient_clipping"] == 0.0
    gpu = ds_config(TrainerConfig(), None)
    assert gpu["bf16"]["enabled"] and gpu["zero_optimization"]["stage"] == 3
    assert "optimizer" not in gpu


def test_param_groups_exclude_norms_and_biases_from_decay() -> None:
    import torch

    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.LayerNorm(4))
    decay, no_decay = param_groups(model, 0.1)
    assert decay["weight_decay"] == 0.1 and len(decay["params"]) == 1
    assert no_decay["weight_decay"] == 0.0 and len(no_decay["params"]) == 3


def test_staleness_and_means() -> None:
    rows = [{"behavior_version": 3}, {"behavior_version": 1}]
    assert staleness(rows, 4) == {"staleness/mean": 2.0, "staleness/max": 3.0}
    assert staleness([{"prompt_ids": []}], 4) == {}
    assert mean_of([{"a": 1.0}, {"a": 3.0}]) == {"a": 2.0}
    # without torch.distributed the reduction is the identity
    assert reduce_across_ranks({"a": 1.0}, {"tokens": 5.0}, "cpu") == {"a": 1.0, "tokens": 5.0}
    assert agree(False, True, "cpu") == (False, True)


def test_jsonl_log_appends_records(tmp_path: Path) -> None:
    log = JsonlWriter(tmp_path / "m.jsonl", timestamp=True, run="r")
    log.write({"loss/pg": 1.5})
    log.write({"loss/pg": 0.5})
    JsonlWriter(None).write(x=1)  # other ranks: nothing
    records = [json.loads(x) for x in (tmp_path / "m.jsonl").read_text().splitlines()]
    assert [r["loss/pg"] for r in records] == [1.5, 0.5] and records[0]["run"] == "r"


class ListShard:
    """A stand-in for a Ray Data shard over a fixed list (the real one is in integration)."""

    def __init__(self, n: int):
        self.table = pa.table({"i": list(range(n))})
        self.opened = 0

    def iter_batches(self, batch_size, batch_format, drop_last, prefetch_batches):
        assert batch_format == "pyarrow" and drop_last
        self.opened += 1
        for start in range(0, self.table.num_rows - batch_size + 1, batch_size):
            yield self.table.slice(start, batch_size)


def test_row_stream_stops_at_the_end_without_cycle() -> None:
    stream = RowStream(ListShard(5), rows_per_step=2, cycle=False)
    got = [stream.next() for _ in range(3)]
    assert got == [[{"i": 0}, {"i": 1}], [{"i": 2}, {"i": 3}], None]


def test_row_stream_cycles_passes_and_gives_up_on_empty_data() -> None:
    shard = ListShard(4)
    stream = RowStream(shard, rows_per_step=4, cycle=True)
    assert [stream.next() for _ in range(3)] == [[{"i": i} for i in range(4)]] * 3
    assert shard.opened == 3
    empty = RowStream(ListShard(1), rows_per_step=2, cycle=True)
    assert empty.next() is None


@pytest.mark.parametrize("n", [0, 3])
def test_row_stream_never_returns_a_short_batch(n: int) -> None:
    assert RowStream(ListShard(n), rows_per_step=4, cycle=True).next() is None


def _agree_worker(rank: int, store: str, out: str) -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2)
    try:
        # rank 1 has run out of data; only rank 0 wants a report
        got = [
            agree(ready=rank == 0, want_report=rank == 0, device="cpu"),
            agree(ready=True, want_report=False, device="cpu"),
            (any_rank(rank == 1, "cpu"), any_rank(False, "cpu")),
        ]
    finally:
        dist.destroy_process_group()
    Path(out, f"{rank}.json").write_text(json.dumps(got))


def test_agree_across_two_gloo_ranks(tmp_path: Path) -> None:
    import torch.multiprocessing as mp

    # spawn, not fork: the session's Ray cluster has threads in this process, and a forked
    # child can inherit a lock one of them holds. A file store needs no free port.
    mp.start_processes(
        _agree_worker,
        args=(str(tmp_path / "store"), str(tmp_path)),
        nprocs=2,
        join=True,
        start_method="spawn",
    )
    got = [json.loads((tmp_path / f"{rank}.json").read_text()) for rank in (0, 1)]
    assert got[0] == got[1]
    assert got[0][0] == [False, True]  # nobody steps; everyone reports
    assert got[0][1] == [True, False]
    assert got[0][2] == [True, False]  # rank 1's stop wish reaches rank 0


def test_lineage_steps_merge_across_ranks_and_every_kind_is_carried(tmp_path: Path) -> None:
    from train_loops.lineage import lineage_ids, read_lineage, read_lineages, write_lineages
    from train_loops.loop import _gather, _merge_steps

    rank0 = [{"step": 3, "ids": ["b", "a"]}, {"step": 4, "ids": ["e"]}]
    rank1 = [{"step": 3, "ids": ["c"]}, {"step": 4, "ids": ["d"]}]
    assert _gather(rank0) == rank0  # without torch.distributed: this rank's alone
    merged = _merge_steps(rank0 + rank1)
    assert merged == [{"step": 3, "ids": ["a", "b", "c"]}, {"step": 4, "ids": ["d", "e"]}]
    write_lineages(tmp_path, {"rl": merged, "sft": [{"step": 1, "ids": ["s"]}]})
    assert read_lineage(tmp_path) == merged and lineage_ids(merged) == set("abcde")
    assert read_lineages(tmp_path)["sft"] == [{"step": 1, "ids": ["s"]}]
    assert read_lineages(tmp_path / "nowhere") == {} and read_lineage(None) == []


def test_an_sft_progress_line_names_the_run_step_loss_and_time_left() -> None:
    from train_loops.loop import progress_line

    metrics = {"loss/total": 0.41234, "step_time": 1.2, "time/data_wait": 0.3}
    line = progress_line("bc_sft", 100, 400, metrics)
    assert line == "[train bc_sft] step 100/400 loss 0.4123 1.50 s/step, about 7.5 min left"
    assert progress_line("x", 400, 400, metrics).endswith("about 0.0 min left")
