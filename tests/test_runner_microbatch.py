"""Micro-batching of the trainer: sample and padded-token caps, by hand."""

from __future__ import annotations

import pytest

from crl_bench.training.role_trainer import TrainSample, micro_batches, timed


def sample(prompt: int, completion: int = 4) -> TrainSample:
    return TrainSample([1] * prompt, [2] * completion, [-0.1] * completion, 1.0)


def lengths(chunks):
    return [[len(s.prompt_ids) + len(s.completion_ids) for s in c] for c in chunks]


def test_sample_cap_only():
    samples = [sample(p) for p in (96, 96, 46, 46, 16)]  # 100, 100, 50, 50, 20 tokens
    assert lengths(micro_batches(samples, 2)) == [[100, 100], [50, 50], [20]]


def test_token_cap_counts_padding_to_the_longest():
    samples = [sample(p) for p in (296, 196, 146, 96, 96, 46)]  # 300 200 150 100 100 50
    # 500 padded tokens: [300] (300*2=600 > 500), [200, 150] (400), then 100*3 = 300 with
    # [100, 100, 50]; the sample cap of 4 never binds
    assert lengths(micro_batches(samples, 4, 500)) == [[300], [200, 150], [100, 100, 50]]
    # a sample longer than the cap goes alone, and nothing is dropped
    assert lengths(micro_batches([sample(996), sample(46)], 4, 500)) == [[1000], [50]]
    assert micro_batches([], 4, 500) == []


def test_bad_size():
    with pytest.raises(ValueError, match=r"^micro-batch size must be >= 1, got 0$"):
        micro_batches([sample(1)], 0)
    assert lengths(micro_batches([sample(1)], 1)) == [[5]]


def test_sample_cap_with_a_token_cap_that_never_binds_and_exact_fits():
    samples = [sample(p) for p in (46, 46, 46)]  # 50 tokens each
    # 3 x 50 = 150 fits a cap of exactly 150; one token less splits
    assert lengths(micro_batches(samples, 8, 150)) == [[50, 50, 50]]
    assert lengths(micro_batches(samples, 8, 149)) == [[50, 50], [50]]
    # the longest sets the padded width even when it came first
    assert lengths(micro_batches([sample(96), sample(6), sample(6)], 8, 200)) == [[100, 10], [10]]
    # the completion counts as much as the prompt
    long_completions = [sample(1, 99), sample(1, 99)]
    assert lengths(micro_batches(long_completions, 8, 150)) == [[100], [100]]
    # a cap of 1 token: every sample goes alone
    assert lengths(micro_batches([sample(1), sample(1)], 8, 1)) == [[5], [5]]


def test_timed_adds_up_even_when_the_block_raises():
    import time

    metrics = {"other": 1.0}
    with timed(metrics, "t"):
        time.sleep(0.01)
    first = metrics["t"]
    assert 0.005 < first < 5
    with pytest.raises(RuntimeError):
        with timed(metrics, "t"):
            time.sleep(0.01)
            raise RuntimeError("boom")
    assert metrics["t"] > first + 0.005 and metrics["other"] == 1.0
