"""Pure loss functions of ../shared/METHOD.md §4–§5 (torch only; no logging, no config reads).

Conventions, shared by every function here:

- Token tensors are ``[B, T]``: B samples, T positions of the response window (see
  ``train_loops.batching``); sample tensors are ``[B]``.
- ``loss_mask`` is bool ``[B, T]``, True = a trained response token. A token whose log-probs
  (current, behaviour, privileged or reference, whichever the term reads) are not finite is
  *dropped* from that term's mask, never zeroed into the sum.
- Reduction: per-sample token mean over that sample's kept tokens, then the mean over all B
  samples (a sample with no kept tokens contributes 0 and still counts in B, so a batch split
  into equal micro-batches and ranks gives exactly the same gradient). Empty batches give 0.
- Every loss returns ``(loss, metrics)``: a scalar tensor with its graph, and a dict of
  detached Python floats with namespaced keys.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

from train_loops.self_distill import SelfDistillation

Metrics = dict[str, float]

# |log ρ| beyond this is clamped (zero gradient there) so exp never overflows to inf.
MAX_LOG_RATIO = 20.0


# --------------------------------------------------------------------------- reductions


def keep_finite(mask: Tensor, *logprobs: Tensor) -> Tensor:
    """``mask`` [B, T] bool with every position where any of ``logprobs`` is non-finite dropped."""
    for lp in logprobs:
        mask = mask & torch.isfinite(lp)
    return mask


def masked(x: Tensor, mask: Tensor) -> Tensor:
    """``x`` with masked-out positions set to 0 (no inf/nan can leak into sums or gradients)."""
    return torch.where(mask, x, torch.zeros_like(x))


def token_mean_per_sample(x: Tensor, mask: Tensor) -> Tensor:
    """[B, T], [B, T] bool → [B]: mean of ``x`` over each sample's True positions (0 if none)."""
    count = mask.sum(dim=-1).clamp(min=1)
    return masked(x, mask).sum(dim=-1) / count.to(x.dtype)


def sample_mean(x: Tensor) -> Tensor:
    """[B] → scalar mean; 0 (with a graph) for B = 0."""
    return x.mean() if x.numel() > 0 else x.sum()


def per_sample_token_mean(x: Tensor, mask: Tensor) -> Tensor:
    """[B, T], [B, T] bool → scalar: token mean per sample, then mean over the B samples."""
    return sample_mean(token_mean_per_sample(x, mask))


def masked_mean(x: Tensor, mask: Tensor) -> float:
    """Plain mean of ``x`` over True positions as a float, 0.0 if there are none (metrics)."""
    n = int(mask.sum())
    return float(masked(x.detach(), mask).sum()) / n if n else 0.0


# --------------------------------------------------------------------------- advantages


def rewards_from_scores(scores: Tensor) -> Tensor:
    """[N] terminal scores s ∈ [0, 1] → [N] rewards r = +1 if s ≥ 1 else -1 (METHOD.md §4)."""
    return torch.where(scores >= 1.0, 1.0, -1.0).to(torch.float32)


def group_advantages(rewards: Tensor, group_ids: Tensor, eps: float = 1e-6) -> Tensor:
    """GRPO advantages ``A_i = (r_i - mean_g r) / (std_g r + eps)`` within each group.

    rewards: [N] float, one per episode; group_ids: [N] int, episodes of one task share an id.
    Returns [N]. The std is unbiased (n-1); a group whose rewards are all equal, or that has a
    single episode, gets A = 0 for all its members.
    """
    _, inverse = torch.unique(group_ids, return_inverse=True)
    r = rewards.to(torch.float64)
    n = torch.bincount(inverse).to(torch.float64)
    mean = torch.zeros_like(n).index_add_(0, inverse, r) / n
    centred = r - mean[inverse]
    ss = torch.zeros_like(n).index_add_(0, inverse, centred**2)
    std = torch.sqrt(ss / (n - 1).clamp(min=1))
    adv = centred / (std[inverse] + eps)
    adv = torch.where(n[inverse] > 1, adv, torch.zeros_like(adv))
    return adv.to(rewards.dtype)


# --------------------------------------------------------------------------- policy gradient


def policy_gradient_loss(
    logprobs: Tensor,
    behavior_logprobs: Tensor,
    advantages: Tensor,
    loss_mask: Tensor,
    clip_eps: float = 0.2,
    clip_eps_high: float = 0.2,
    tis_cap: float | None = None,
    ratio_anchor: str = "behaviour",
) -> tuple[Tensor, Metrics]:
    """GRPO/PPO-clip: ``L_PG = -mean_t w_t · min(ρ_t A, clip(ρ_t, 1-ε, 1+ε_high) A)``.

    logprobs: [B, T] log π_θ(y_t | c), with grad; behavior_logprobs: [B, T] b_t from sampling;
    advantages: [B] (one per sample, shared by its tokens); loss_mask: [B, T] bool.

    ``ratio_anchor="behaviour"`` (METHOD.md §4): ρ_t = exp(log π_θ - b_t), w_t = 1: the ratio
    against the inference engine's sampling log-probs, so a stale or engine-mismatched sample
    is clipped. ``"recomputed"`` (the authors' slime setup: old log-probs recomputed by the
    trainer before its one update per rollout batch): ρ_t = exp(log π_θ - sg[log π_θ]), value
    1, gradient A·∇log π_θ; with a cap C (``tis_cap``) each token is also weighted by the
    truncated importance-sampling correction w_t = min(exp(sg[log π_θ] - b_t), C) (decoupled
    PPO for stale samples). ``tis_cap`` needs the recomputed anchor.
    |log ρ_t| is clamped at ``MAX_LOG_RATIO`` so that exp never overflows.
    """
    if ratio_anchor not in ("behaviour", "recomputed"):
        raise ValueError(f"ratio_anchor must be 'behaviour' or 'recomputed', got {ratio_anchor!r}")
    if tis_cap is not None and ratio_anchor == "behaviour":
        raise ValueError("tis_cap needs ratio_anchor='recomputed'")
    mask = keep_finite(loss_mask, logprobs, behavior_logprobs)
    lp = masked(logprobs, mask)
    behaviour = masked(behavior_logprobs, mask)
    if ratio_anchor == "behaviour":
        anchor, weight = behaviour, torch.ones_like(lp)
    else:
        anchor = lp.detach()
        weight = (
            torch.ones_like(lp)
            if tis_cap is None
            else torch.exp(anchor - behaviour).clamp(max=tis_cap)
        )
    ratio = torch.exp((lp - anchor).clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO))
    adv = advantages.to(lp.dtype)[:, None]
    unclipped = ratio * adv
    clipped = ratio.clamp(1.0 - clip_eps, 1.0 + clip_eps_high) * adv
    per_token = -weight * torch.minimum(unclipped, clipped)
    loss = per_sample_token_mean(per_token, mask)
    metrics = {
        "pg/clip_frac": masked_mean((clipped < unclipped).float(), mask),
        "pg/ratio_mean": masked_mean(
            torch.exp((lp.detach() - behaviour).clamp(max=MAX_LOG_RATIO)), mask
        ),
        "pg/tis_weight_mean": masked_mean(weight, mask),
        "pg/frac_dropped": _frac_dropped(loss_mask, mask),
        # With ρ = 1 (one update per batch) L_PG's value is -mean A, ~0 for whole groups, while
        # its gradient is not: this is the share of samples that carry a policy gradient.
        "pg/frac_nonzero_adv": float((advantages != 0).to(lp.dtype).mean()),
    }
    return loss, metrics


def _frac_dropped(loss_mask: Tensor, kept: Tensor) -> float:
    n = int(loss_mask.sum())
    return 1.0 - int(kept.sum()) / n if n else 0.0


# --------------------------------------------------------------------------- reference KL


def kl_k3_loss(
    logprobs: Tensor, ref_logprobs: Tensor, loss_mask: Tensor, clamp: float = 10.0
) -> tuple[Tensor, Metrics]:
    """k3 estimator of KL(π_θ ‖ π_ref): ``exp(q) - q - 1`` with ``q = clamp(log π_ref - log π_θ)``.

    logprobs: [B, T] with grad; ref_logprobs: [B, T] from the frozen reference; loss_mask [B, T].
    """
    mask = keep_finite(loss_mask, logprobs, ref_logprobs)
    q = (masked(ref_logprobs, mask) - masked(logprobs, mask)).clamp(-clamp, clamp)
    k3 = torch.exp(q) - q - 1.0
    loss = per_sample_token_mean(k3, mask)
    return loss, {"kl/k3_token_mean": masked_mean(k3, mask)}


# --------------------------------------------------------------------------- self-distillation


def self_distillation_loss(
    logprobs: Tensor,
    privileged_logprobs: Tensor,
    d: Tensor,
    v: Tensor,
    loss_mask: Tensor,
    variant: SelfDistillation,
    guided: Tensor | None = None,
) -> tuple[Tensor, Metrics]:
    """Value-gated self-distillation ``L_SD = mean_samples mean_t d·g_t·m·(T_t - s_t)``.

    logprobs: [B, T] s_t = log π_θ(y_t | c) with grad; privileged_logprobs: [B, T] T_t
    (constants from the privileged rescoring); d: [B] ∈ {-1, 0, +1}; v: [B] ∈ [0, 1];
    loss_mask: [B, T]; guided: [B] bool or None (all True), False where the analyzer gave no
    guidance text. ``variant`` supplies the effective direction, the gate g_t (computed
    from Δ_t = T_t - sg[s_t], never differentiated) and the magnitude m. Its gradient is
    ``-d·g_t·m·∇s_t``. Tokens of samples whose effective direction is 0, or that have no
    guidance (no distillation target, as in the reference), are masked in every variant.
    """
    direction = variant.direction(d.to(logprobs.dtype))
    active = direction != 0
    if guided is not None:
        active = active & guided.to(torch.bool)
    mask = keep_finite(loss_mask, logprobs, privileged_logprobs) & active[:, None]
    lp = masked(logprobs, mask)
    target = masked(privileged_logprobs, mask)
    delta = (target - lp).detach()
    gate = variant.gate(delta, direction[:, None]).detach()
    coef = direction[:, None] * gate * variant.magnitude(v.to(lp.dtype))[:, None]
    loss = per_sample_token_mean(coef * (target - lp), mask)
    metrics = {
        "sd/gate_mean": masked_mean(gate, mask),
        "sd/delta_mean": masked_mean(delta, mask),
        "sd/frac_masked": _frac_dropped(loss_mask, mask),
    }
    return loss, metrics


# --------------------------------------------------------------------------- totals


class RLTerms(NamedTuple):
    """Per-batch constants of the RL loss. Token tensors [B, T], sample tensors [B]."""

    behavior_logprobs: Tensor
    privileged_logprobs: Tensor
    advantages: Tensor
    d: Tensor
    v: Tensor
    loss_mask: Tensor
    guided: Tensor | None = None  # [B] bool: the step has guidance text (None: all have)


class RLCoefs(NamedTuple):
    """Scalars of the total RL loss (``LossConfig`` without the pydantic)."""

    clip_eps: float = 0.2
    clip_eps_high: float = 0.2
    tis_cap: float | None = None
    kl_coef: float = 0.01
    kl_clamp: float = 10.0
    sd_coef: float = 0.01
    ratio_anchor: str = "behaviour"


def rl_loss(
    logprobs: Tensor,
    terms: RLTerms,
    coefs: RLCoefs,
    variant: SelfDistillation,
    ref_logprobs: Tensor | None = None,
) -> tuple[Tensor, Metrics]:
    """``L = L_PG + β_KL·KL + λ_SD·L_SD`` (METHOD.md §5); KL only when ``ref_logprobs`` given.

    logprobs: [B, T] current log-probs with grad; ref_logprobs: [B, T] or None.
    Metric keys: ``loss/total``, ``loss/pg``, ``loss/kl``, ``loss/sd`` plus the terms' own.
    """
    pg, metrics = policy_gradient_loss(
        logprobs,
        terms.behavior_logprobs,
        terms.advantages,
        terms.loss_mask,
        coefs.clip_eps,
        coefs.clip_eps_high,
        coefs.tis_cap,
        coefs.ratio_anchor,
    )
    sd, sd_metrics = self_distillation_loss(
        logprobs,
        terms.privileged_logprobs,
        terms.d,
        terms.v,
        terms.loss_mask,
        variant,
        terms.guided,
    )
    total = pg + coefs.sd_coef * sd
    kl = torch.zeros((), dtype=logprobs.dtype, device=logprobs.device)
    if ref_logprobs is not None:
        kl, kl_metrics = kl_k3_loss(logprobs, ref_logprobs, terms.loss_mask, coefs.kl_clamp)
        metrics.update(kl_metrics)
        total = total + coefs.kl_coef * kl
    metrics.update(sd_metrics)
    metrics.update(
        {
            "loss/total": float(total.detach()),
            "loss/pg": float(pg.detach()),
            "loss/sd": float(sd.detach()),
            "loss/kl": float(kl.detach()),
        }
    )
    return total, metrics


def sft_loss(
    logprobs: Tensor, loss_mask: Tensor, weights: Tensor | None = None
) -> tuple[Tensor, Metrics]:
    """Cross-entropy on target tokens: per-sample token mean of ``-log π_θ(y_t | c)``.

    logprobs: [B, T] with grad; loss_mask: [B, T] bool, True on target tokens; weights: [B, T]
    token weights or None. With weights each sample's mean is ``Σ w_t·nll_t / Σ w_t`` over its
    kept tokens, so a sample still counts once while its heavy tokens dominate it.
    """
    mask = keep_finite(loss_mask, logprobs)
    nll = -masked(logprobs, mask)
    if weights is None:
        loss = per_sample_token_mean(nll, mask)
    else:
        w = masked(weights.to(nll.dtype), mask)
        loss = sample_mean((w * nll).sum(-1) / w.sum(-1).clamp(min=1e-8))
    return loss, {"loss/sft": float(loss.detach()), "loss/total": float(loss.detach())}
