"""PPO-clip and CISPO losses, aggregation, k3 KL and entropy against numbers worked out by hand."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from crl_bench.algorithms import LOSSES
from crl_bench.algorithms.losses import (aggregate, cispo_loss, entropy_from_logits, kl_k3,
                                         ppo_clip_loss)
from crl_bench.registry import RegistryError

LN = math.log


def _lp(ratios: list[list[float]]) -> tuple[torch.Tensor, torch.Tensor]:
    """(logprobs leaf with grad, old_logprobs = 0) so that exp(logprobs - old) = ratios."""
    logprobs = torch.tensor([[LN(r) for r in row] for row in ratios], requires_grad=True)
    return logprobs, torch.zeros_like(logprobs)


# ---------------------------------------------------------------------------------------------
# aggregation
# ---------------------------------------------------------------------------------------------

VALUES = torch.tensor([[1.0, 2.0, 3.0], [4.0, 9.0, 9.0], [7.0, 7.0, 7.0]])
MASK = torch.tensor([[1, 1, 1], [1, 0, 0], [0, 0, 0]], dtype=torch.bool)


@pytest.mark.parametrize("mode, expected", [
    ("token-mean", (1 + 2 + 3 + 4) / 4),         # 2.5
    ("seq-mean-token-mean", (2.0 + 4.0) / 2),    # row means 2 and 4; the empty row is left out
    ("seq-mean-token-sum", (6.0 + 4.0) / 2),     # row sums 6 and 4
])
def test_aggregate_by_hand(mode, expected):
    assert aggregate(VALUES, MASK, mode).item() == pytest.approx(expected)


def test_aggregate_ignores_nan_padding_and_empty_mask_is_zero_with_graph():
    values = VALUES.clone()
    values[2] = float("nan")
    assert aggregate(values, MASK, "token-mean").item() == pytest.approx(2.5)
    x = torch.ones(2, 3, requires_grad=True)
    out = aggregate(x, torch.zeros(2, 3, dtype=torch.bool), "seq-mean-token-sum")
    assert out.item() == 0.0
    out.backward()
    assert torch.equal(x.grad, torch.zeros(2, 3))


def test_aggregate_bad_mode_and_shapes():
    with pytest.raises(ValueError, match="Available: token-mean, seq-mean-token-mean"):
        aggregate(VALUES, MASK, "sum")
    with pytest.raises(ValueError, match="same"):
        aggregate(VALUES, MASK[:, :2])


# ---------------------------------------------------------------------------------------------
# PPO clip
# ---------------------------------------------------------------------------------------------

def test_ppo_clip_per_token_values_and_gradients_by_hand():
    # four tokens, eps 0.2 (clip range [0.8, 1.2]):
    #  r=1.5, A=+1: max(-1.5, -1.2) = -1.2  clipped -> no gradient
    #  r=0.5, A=+1: max(-0.5, -0.8) = -0.5  unclipped -> d/dlogp = -A r = -0.5
    #  r=0.5, A=-1: max( 0.5,  0.8) =  0.8  clipped -> no gradient
    #  r=1.5, A=-1: max( 1.5,  1.2) =  1.5  unclipped -> d/dlogp = -A r = +1.5
    logprobs, old = _lp([[1.5, 0.5, 0.5, 1.5]])
    adv = torch.tensor([[1.0, 1.0, -1.0, -1.0]])
    mask = torch.ones(1, 4, dtype=torch.bool)
    loss, metrics = ppo_clip_loss(logprobs, old, adv, mask, clip_eps=0.2)
    assert loss.item() == pytest.approx((-1.2 - 0.5 + 0.8 + 1.5) / 4)
    loss.backward()
    torch.testing.assert_close(logprobs.grad, torch.tensor([[0.0, -0.5, 0.0, 1.5]]) / 4)
    assert metrics["clip_frac"] == pytest.approx(0.5)
    assert metrics["clip_frac_low"] == pytest.approx(0.5)
    assert metrics["clip_frac_high"] == pytest.approx(0.5)
    assert metrics["ratio_mean"] == pytest.approx(1.0)
    assert metrics["ratio_max"] == pytest.approx(1.5)
    # k3 of KL(old || new) per token: (r - 1) - ln r
    k3 = [(r - 1) - LN(r) for r in (1.5, 0.5, 0.5, 1.5)]
    assert metrics["approx_kl"] == pytest.approx(sum(k3) / 4, rel=1e-5)
    assert metrics["n_tokens"] == 4


def test_ppo_asymmetric_clip_higher():
    # eps 0.2 low, 0.28 high: r=1.25 with A=+1 lies inside [0.8, 1.28] -> unclipped, -1.25
    logprobs, old = _lp([[1.25]])
    adv, mask = torch.ones(1, 1), torch.ones(1, 1)
    loss, m = ppo_clip_loss(logprobs, old, adv, mask, clip_eps=0.2, clip_eps_high=0.28)
    assert loss.item() == pytest.approx(-1.25)
    assert m["clip_frac"] == 0.0
    loss_sym, m_sym = ppo_clip_loss(logprobs, old, adv, mask, clip_eps=0.2)
    assert loss_sym.item() == pytest.approx(-1.2) and m_sym["clip_frac"] == 1.0


def test_ppo_dual_clip_caps_negative_advantage_tokens():
    # r=4, A=-1: standard max(4, 1.2) = 4; dual clip c=3 caps it at -A*c = 3 (no gradient)
    # r=4, A=+1: max(-4, -1.2) = -1.2; dual clip leaves positive advantages alone
    logprobs, old = _lp([[4.0, 4.0]])
    adv = torch.tensor([[-1.0, 1.0]])
    mask = torch.ones(1, 2)
    loss, m = ppo_clip_loss(logprobs, old, adv, mask, dual_clip=3.0)
    assert loss.item() == pytest.approx((3.0 - 1.2) / 2)
    loss.backward()
    torch.testing.assert_close(logprobs.grad, torch.zeros(1, 2))
    assert m["dual_clip_frac"] == pytest.approx(0.5)
    with pytest.raises(ValueError, match="dual_clip must be a finite number > 1"):
        ppo_clip_loss(logprobs, old, adv, mask, dual_clip=0.5)


def test_ppo_on_policy_gradient_is_minus_advantage():
    # ratio 1 everywhere: gradient of the surrogate is -A per token (the policy-gradient theorem)
    logprobs = torch.zeros(2, 3, requires_grad=True)
    adv = torch.tensor([[0.5, 0.5, 0.5], [-2.0, -2.0, -2.0]])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    loss, m = ppo_clip_loss(logprobs, logprobs.detach(), adv, mask)
    loss.backward()
    torch.testing.assert_close(logprobs.grad, torch.tensor([[-0.5, -0.5, 0], [2.0, 0, 0]]) / 3)
    assert m["clip_frac"] == 0.0 and m["approx_kl"] == 0.0


# ---------------------------------------------------------------------------------------------
# CISPO
# ---------------------------------------------------------------------------------------------

def test_cispo_values_by_hand():
    # eps 0.1 both sides: weights clip(1.5)=1.1, clip(0.5)=0.9, clip(1.05)=1.05
    ratios = [1.5, 0.5, 1.05]
    logprobs, old = _lp([ratios])
    adv = torch.tensor([[2.0, -1.0, 1.0]])
    mask = torch.ones(1, 3)
    loss, m = cispo_loss(logprobs, old, adv, mask)
    # per token -w * A * logp
    expected = (-1.1 * 2.0 * LN(1.5) + (-0.9) * (-1.0) * LN(0.5) - 1.05 * 1.0 * LN(1.05)) / 3
    assert loss.item() == pytest.approx(expected, rel=1e-5)
    loss.backward()
    torch.testing.assert_close(logprobs.grad, torch.tensor([[-1.1 * 2.0, 0.9, -1.05]]) / 3)
    assert m["clip_frac"] == pytest.approx(2 / 3)
    assert m["clip_frac_low"] == pytest.approx(1 / 3)
    assert m["weight_mean"] == pytest.approx((1.1 + 0.9 + 1.05) / 3, rel=1e-5)


def test_cispo_asymmetric_eps_by_hand():
    """eps_low != eps_high, so swapping them (or using one for both) changes the numbers.
    CISPO (MiniMax-M1 report, eq. 4-5): weight = sg(clip(r, 1 - eps_low, 1 + eps_high)); the
    official extractor loss is the same (ComplementaryRL fork of ROLL,
    roll/pipeline/agentic/memory/memory_model/memory_model_worker.py:438-449:
    clip_lower = 1 - epsilon_low, clip_upper = 1 + epsilon_high, torch.clamp(ratio, ...))."""
    ratios = [1.5, 0.5, 1.1, 0.8, 1.02]
    logprobs, old = _lp([ratios])
    adv = torch.tensor([[1.0, -2.0, 0.5, 1.0, -1.0]])
    mask = torch.ones(1, 5)
    loss, m = cispo_loss(logprobs, old, adv, mask, eps_low=0.3, eps_high=0.05)
    # floor 0.7, ceiling 1.05: 1.5 -> 1.05, 0.5 -> 0.7, 1.1 -> 1.05, 0.8 and 1.02 unclipped
    w = [1.05, 0.7, 1.05, 0.8, 1.02]
    a = [1.0, -2.0, 0.5, 1.0, -1.0]
    expected = sum(-wi * ai * LN(ri) for wi, ai, ri in zip(w, a, ratios)) / 5
    assert loss.item() == pytest.approx(expected, rel=1e-5)
    loss.backward()
    torch.testing.assert_close(logprobs.grad, torch.tensor([[-wi * ai / 5 for wi, ai in zip(w, a)]]))
    assert m["clip_frac_high"] == pytest.approx(2 / 5)
    assert m["clip_frac_low"] == pytest.approx(1 / 5)
    assert m["clip_frac"] == pytest.approx(3 / 5)
    assert m["weight_mean"] == pytest.approx(sum(w) / 5, rel=1e-5)


def test_cispo_one_sided_caps_only_from_above():
    logprobs, old = _lp([[1.5, 0.5]])
    adv, mask = torch.ones(1, 2), torch.ones(1, 2)
    loss, m = cispo_loss(logprobs, old, adv, mask, eps_high=0.1, one_sided=True)
    loss.backward()
    # weights: min(1.5, 1.1) = 1.1 and 0.5 (no floor)
    torch.testing.assert_close(logprobs.grad, torch.tensor([[-1.1, -0.5]]) / 2)
    assert m["clip_frac_low"] == 0.0 and m["clip_frac_high"] == pytest.approx(0.5)


def test_outside_clip_range_cispo_keeps_the_gradient_ppo_drops_it():
    """The property the paper relies on, with log-probs coming from a real parameter.

    A tiny softmax policy over 4 tokens: logits = W x. For tokens whose ratio lies outside
    [1 - eps, 1 + eps] on the side their advantage pushes, PPO's gradient w.r.t. W is exactly 0
    while CISPO's is clip(ratio) * A * grad log pi (divided by the token count, token-mean).
    """
    torch.manual_seed(0)
    x = torch.randn(3, 5)
    tokens = torch.tensor([0, 2, 3])
    W = torch.randn(4, 5, requires_grad=True)

    def logprobs_of(weight: torch.Tensor) -> torch.Tensor:
        return torch.log_softmax(x @ weight.T, dim=-1).gather(1, tokens[:, None]).T  # [1, 3]

    current = logprobs_of(W)
    # old log-probs chosen so the ratios are 1.6, 1.3 (A > 0: above 1 + eps) and 0.5 (A < 0:
    # below 1 - eps) -- all outside [0.9, 1.1] / [0.8, 1.2] in the direction of their advantage
    ratios = torch.tensor([[1.6, 1.3, 0.5]])
    old = current.detach() - torch.log(ratios)
    adv = torch.tensor([[1.0, 0.5, -2.0]])
    mask = torch.ones(1, 3)

    ppo, _ = ppo_clip_loss(current, old, adv, mask, clip_eps=0.2)
    (ppo_grad,) = torch.autograd.grad(ppo, W)
    assert torch.count_nonzero(ppo_grad) == 0

    cispo, _ = cispo_loss(logprobs_of(W), old, adv, mask, eps_low=0.1, eps_high=0.1)
    (cispo_grad,) = torch.autograd.grad(cispo, W)
    clipped = ratios.clamp(0.9, 1.1)
    expected = torch.zeros_like(W)
    for i in range(3):
        (g_logp,) = torch.autograd.grad(logprobs_of(W)[0, i], W)
        expected -= clipped[0, i] * adv[0, i] * g_logp / 3   # loss = -objective
    torch.testing.assert_close(cispo_grad, expected)
    assert torch.count_nonzero(cispo_grad) > 0


def test_losses_are_registered_by_name():
    assert set(LOSSES.names()) >= {"ppo_clip", "cispo"}
    assert LOSSES.get("cispo") is cispo_loss and LOSSES.get("ppo_clip") is ppo_clip_loss
    with pytest.raises(RegistryError, match="Available: cispo, ppo_clip"):
        LOSSES.get("reinforce")


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.floats(-3, 3), st.floats(-3, 3), st.floats(-5, 5)),
                min_size=1, max_size=16),
       st.sampled_from(["token-mean", "seq-mean-token-mean", "seq-mean-token-sum"]))
def test_on_policy_ppo_and_cispo_share_the_policy_gradient(rows, agg):
    """At ratio 1 (one update per batch, first epoch) PPO and CISPO give the same gradient."""
    logp = torch.tensor([[r[0] for r in rows]], dtype=torch.float64)
    adv = torch.tensor([[r[2] for r in rows]], dtype=torch.float64)
    mask = torch.tensor([[r[1] > -1 for r in rows]])
    a = logp.clone().requires_grad_(True)
    b = logp.clone().requires_grad_(True)
    ppo_clip_loss(a, logp, adv, mask, agg=agg)[0].backward()
    cispo_loss(b, logp, adv, mask, agg=agg)[0].backward()
    torch.testing.assert_close(a.grad, b.grad)


# ---------------------------------------------------------------------------------------------
# KL and entropy
# ---------------------------------------------------------------------------------------------

def test_kl_k3_by_hand_and_nonnegative():
    logp = torch.tensor([LN(0.5), LN(0.2), LN(0.4)])
    ref = torch.tensor([LN(0.25), LN(0.2), LN(0.8)])
    # k3 = p_ref/p - ln(p_ref/p) - 1: ratios 0.5, 1, 2
    expected = torch.tensor([0.5 - LN(0.5) - 1, 0.0, 2 - LN(2) - 1])
    torch.testing.assert_close(kl_k3(logp, ref), expected)
    assert (kl_k3(torch.randn(50), torch.randn(50)) >= 0).all()


def test_entropy_from_logits_by_hand():
    logits = torch.tensor([[0.0, 0.0, 0.0, 0.0], [0.0, -1e9, -1e9, -1e9]])
    torch.testing.assert_close(entropy_from_logits(logits), torch.tensor([LN(4), 0.0]))
    # p = (0.5, 0.25, 0.25): H = 0.5 ln 2 + 2 * 0.25 ln 4 = 1.5 ln 2
    h = entropy_from_logits(torch.log(torch.tensor([0.5, 0.25, 0.25])))
    assert h.item() == pytest.approx(1.5 * LN(2), rel=1e-6)


# ---------------------------------------------------------------------------------------------
# edges: argument checks, clamps, boundaries (each kills a mutant that the values above miss)
# ---------------------------------------------------------------------------------------------

def _refuses(exc, message, fn, *args, **kw):
    import re

    with pytest.raises(exc, match="^" + re.escape(message) + "$"):
        fn(*args, **kw)


@pytest.mark.parametrize("loss", [ppo_clip_loss, cispo_loss])
def test_every_token_tensor_is_checked_by_name(loss):
    good = torch.zeros(2, 3)
    args = dict(logprobs=good, old_logprobs=good, advantages=good, mask=good)
    for name in args:
        bad = dict(args, **{name: torch.zeros(2, 4)})
        # the first tensor sets the shape: a bad first one is reported on the second
        named, got, want = (name, "(2, 4)", "(2, 3)") if name != "logprobs" else (
            "old_logprobs", "(2, 3)", "(2, 4)")
        _refuses(ValueError, f"{named} has shape {got} but the other token tensors have {want}; "
                 "pad all of them to the same [N, T]", loss, *bad.values())
        bad = dict(args, **{name: torch.zeros(6)})
        _refuses(ValueError, f"{name} must be [N, T] (turn samples x tokens), got shape (6,)",
                 loss, *bad.values())
        bad = dict(args, **{name: [[0.0]]})
        _refuses(TypeError, f"{name} must be a torch.Tensor, got list", loss, *bad.values())


def test_aggregate_default_mode_and_a_single_sequence():
    assert aggregate(VALUES, MASK).item() == pytest.approx(2.5)  # token-mean by default
    one = torch.tensor([[1, 1, 0], [0, 0, 0], [0, 0, 0]], dtype=torch.bool)
    # one sequence with tokens: its mean (1.5) / 1 sequence, its sum (3) / 1
    assert aggregate(VALUES, one, "seq-mean-token-mean").item() == pytest.approx(1.5)
    assert aggregate(VALUES, one, "seq-mean-token-sum").item() == pytest.approx(3.0)
    v64 = VALUES.double()
    assert aggregate(v64, MASK, "seq-mean-token-mean").dtype == torch.float64


def test_metrics_of_an_empty_mask_are_zero():
    z = torch.zeros(1, 2, requires_grad=True)
    mask = torch.zeros(1, 2)
    for loss, kw in ((ppo_clip_loss, {}), (cispo_loss, {})):
        value, m = loss(z, torch.ones(1, 2), torch.ones(1, 2), mask, **kw)
        assert value.item() == 0.0
        assert m["clip_frac"] == 0.0 and m["ratio_mean"] == 0.0 and m["ratio_max"] == 0.0
        assert m["approx_kl"] == 0.0 and m["n_tokens"] == 0.0


def test_log_ratio_is_clamped_both_ways():
    logprobs = torch.tensor([[50.0, -50.0]])
    old = torch.zeros(1, 2)
    mask = torch.tensor([[1.0, 0.0]])
    _, m = ppo_clip_loss(logprobs, old, torch.ones(1, 2), mask)
    assert m["ratio_max"] == pytest.approx(math.exp(20), rel=1e-5)
    _, m = ppo_clip_loss(logprobs, old, torch.ones(1, 2), torch.tensor([[0.0, 1.0]]))
    # k3 = (r - 1) - log r with log r clamped at -20: e^-20 - 1 + 20
    assert m["approx_kl"] == pytest.approx(math.exp(-20) + 19, rel=1e-6)
    # kl_k3 clamps the same way
    torch.testing.assert_close(kl_k3(torch.tensor([0.0, 0.0]), torch.tensor([50.0, -50.0])),
                               torch.tensor([math.exp(20) - 21, math.exp(-20) + 19]))
    _refuses(ValueError, "logprobs (2,) and ref_logprobs (3,) must have the same shape",
             kl_k3, torch.zeros(2), torch.zeros(3))


def test_clip_bounds_are_validated_at_their_edges():
    t = torch.zeros(1, 1)
    # the messages name the loss and the range it registers (crl_bench.algorithms), which the
    # run configuration checks too
    for eps in (0.0, 1.0, 1.5):
        _refuses(ValueError, f"ppo_clip: clip_eps must be a finite number > 0 and < 1, got {eps}",
                 ppo_clip_loss, t, t, t, t, clip_eps=eps)
    _refuses(ValueError, "ppo_clip: clip_eps_high must be a finite number > 0 and <= 10, got 0.0",
             ppo_clip_loss, t, t, t, t, clip_eps_high=0.0)
    _refuses(ValueError, "ppo_clip: dual_clip must be a finite number > 1 and <= 1000000 (a cap in "
             "units of |A|; None: off), got 1.0", ppo_clip_loss, t, t, t, t, dual_clip=1.0)
    ppo_clip_loss(t, t, t, t, dual_clip=1.5)  # allowed
    ppo_clip_loss(t, t, t, t, clip_eps=0.9)
    _refuses(ValueError, "cispo: eps_high must be a finite number > 0 and <= 100, got 0.0",
             cispo_loss, t, t, t, t, eps_high=0.0)
    for eps in (0.0, 1.0, 1.5):
        _refuses(ValueError, f"cispo: eps_low must be a finite number > 0 and < 1 (ignored with "
                 f"one_sided), got {eps}", cispo_loss, t, t, t, t, eps_low=eps)
    cispo_loss(t, t, t, t, eps_low=5.0, one_sided=True)  # ignored when one-sided
    _refuses(ValueError, "logits must have a vocabulary dimension [..., V]", entropy_from_logits,
             torch.tensor(1.0))


def test_dual_clip_leaves_positive_advantages_alone_and_clip_fractions_by_side():
    logprobs, old = _lp([[1.0, 1.1, 0.5]])
    adv = torch.tensor([[0.5, 0.5, 0.5]])
    mask = torch.ones(1, 3)
    loss, m = ppo_clip_loss(logprobs, old, adv, mask, clip_eps=0.2, dual_clip=3.0)
    # A > 0: max(-A r, -A clip(r)) = -.5, -.55, max(-.25, -.4) = -.25; no cap (a cap at
    # -A * 3 = -1.5 on these would change the loss)
    assert loss.item() == pytest.approx((-0.5 - 0.55 - 0.25) / 3, rel=1e-5)
    assert m["dual_clip_frac"] == 0.0
    # ratio 1.1 is inside [0.8, 1.2]: neither low nor high; 0.5 is low only
    assert m["clip_frac_low"] == pytest.approx(1 / 3) and m["clip_frac_high"] == 0.0
    _, m = ppo_clip_loss(*_lp([[0.9, 1.5]]), torch.ones(1, 2), torch.ones(1, 2), clip_eps=0.2)
    assert m["clip_frac_high"] == pytest.approx(0.5) and m["clip_frac_low"] == 0.0


def test_entropy_per_row():
    p1 = torch.tensor([0.5, 0.25, 0.25])
    p2 = torch.tensor([0.7, 0.2, 0.1])
    h = entropy_from_logits(torch.log(torch.stack([p1, p2])))
    want = [float(-(p * p.log()).sum()) for p in (p1, p2)]
    torch.testing.assert_close(h, torch.tensor(want))
