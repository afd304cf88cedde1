"""Pure parts of the LLM layer, checked against numbers computed by hand."""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

from crl_bench.llm.batching import collate_sequences, position_ids_from_mask  # noqa: E402
from crl_bench.llm.sampling import filter_logits, sample_next_tokens  # noqa: E402
from crl_bench.llm.types import LoraSpec, SamplingParams  # noqa: E402

NEG = float("-inf")


def test_top_k_keeps_the_k_largest():
    logits = torch.tensor([[1.0, 3.0, 2.0, 0.0]])
    assert filter_logits(logits, top_k=2).tolist() == [[NEG, 3.0, 2.0, NEG]]


def test_top_p_keeps_the_smallest_prefix_reaching_p():
    # probabilities 0.5, 0.3, 0.2 (logits are their logs): mass before each = 0, 0.5, 0.8
    logits = torch.tensor([[math.log(0.5), math.log(0.3), math.log(0.2)]])
    kept = filter_logits(logits, top_p=0.7)      # 0.5 < 0.7 so the second token is still needed
    assert torch.isfinite(kept).tolist() == [[True, True, False]]
    kept = filter_logits(logits, top_p=0.5)      # the first token alone reaches 0.5
    assert torch.isfinite(kept).tolist() == [[True, False, False]]
    kept = filter_logits(logits, top_p=0.01)     # the most likely token is always kept
    assert torch.isfinite(kept).tolist() == [[True, False, False]]


def test_greedy_returns_argmax_and_its_untempered_logprob():
    logits = torch.tensor([[0.0, math.log(3.0)]])  # p = 1/4, 3/4
    tokens, logprobs = sample_next_tokens(logits, temperature=0.0)
    assert tokens.tolist() == [1]
    assert logprobs.item() == pytest.approx(math.log(0.75), abs=1e-6)


def test_sampled_logprob_is_tempered_and_before_truncation():
    logits = torch.tensor([[0.0, 2.0, 4.0]])
    t = 2.0  # tempered logits 0, 1, 2
    z = 1 + math.e + math.e ** 2
    gen = torch.Generator().manual_seed(0)
    tokens, logprobs = sample_next_tokens(logits.repeat(200, 1), temperature=t, top_k=2,
                                          generator=gen)
    assert set(tokens.tolist()) <= {1, 2}                      # top-k removed token 0
    expected = {1: 1 - math.log(z), 2: 2 - math.log(z)}        # log-probs of the full softmax
    for tok, lp in zip(tokens.tolist(), logprobs.tolist()):
        assert lp == pytest.approx(expected[tok], abs=1e-5)


def test_sampling_frequencies_follow_the_distribution():
    probs = torch.tensor([0.1, 0.2, 0.7])
    logits = probs.log()[None].repeat(20000, 1)
    tokens, _ = sample_next_tokens(logits, temperature=1.0,
                                   generator=torch.Generator().manual_seed(1))
    freq = torch.bincount(tokens, minlength=3).float() / tokens.numel()
    assert torch.allclose(freq, probs, atol=0.015), freq


def test_same_generator_seed_same_tokens():
    logits = torch.randn(8, 100, generator=torch.Generator().manual_seed(3))
    a, _ = sample_next_tokens(logits, 1.0, generator=torch.Generator().manual_seed(5))
    b, _ = sample_next_tokens(logits, 1.0, generator=torch.Generator().manual_seed(5))
    assert a.tolist() == b.tolist()


def test_collate_aligns_loss_mask_and_old_logprobs_with_next_token_positions():
    batch = collate_sequences([[5, 6], [7]], [[8, 9], [10, 11, 12]], pad_token_id=0,
                              old_logprobs=[[-0.1, -0.2], [-0.3, -0.4, -0.5]])
    assert batch.input_ids.tolist() == [[5, 6, 8, 9], [7, 10, 11, 12]]
    assert batch.attention_mask.tolist() == [[1, 1, 1, 1], [1, 1, 1, 1]]
    # position t predicts token t+1: completion tokens start at prompt_len - 1
    assert batch.loss_mask.tolist() == [[0, 1, 1], [1, 1, 1]]
    assert torch.allclose(batch.old_logprobs, torch.tensor([[0, -0.1, -0.2], [-0.3, -0.4, -0.5]]))
    batch = collate_sequences([[1, 2, 3]], [[4]], pad_token_id=9)
    assert batch.completion_values(torch.tensor([[0.0, 0.0, 7.0]])) == [[7.0]]
    padded = collate_sequences([[1], [1, 2, 3]], [[4], [5]], pad_token_id=9)
    assert padded.input_ids.tolist() == [[1, 4, 9, 9], [1, 2, 3, 5]]
    assert padded.loss_mask.tolist() == [[1, 0, 0], [0, 0, 1]]


def test_collate_rejects_bad_input_with_reasons():
    with pytest.raises(ValueError, match="prompt 0 is empty"):
        collate_sequences([[]], [[1]], 0)
    with pytest.raises(ValueError, match="completion 0 is empty"):
        collate_sequences([[1]], [[]], 0)
    with pytest.raises(ValueError, match="2 tokens but 1 log-probs"):
        collate_sequences([[1]], [[1, 2]], 0, old_logprobs=[[0.0]])


def test_position_ids_count_real_tokens_only():
    mask = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 0, 0]])
    assert position_ids_from_mask(mask).tolist() == [[0, 0, 0, 1, 2], [0, 1, 2, 2, 2]]


def test_config_validation_names_the_fix():
    with pytest.raises(ValueError, match="tuple of strings"):
        SamplingParams(stop="</answer>")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="top_p"):
        SamplingParams(top_p=0.0)
    with pytest.raises(ValueError, match=">= 0"):
        SamplingParams(temperature=-1)
    assert SamplingParams(temperature=0).logprob_temperature == 1.0
    with pytest.raises(ValueError, match="rank"):
        LoraSpec(r=0)
