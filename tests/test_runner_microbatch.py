"""Micro-batching of the trainer: sample and padded-token caps, by hand."""

from __future__ import annotations

import pytest

from crl_bench.runner.trainer import TrainSample, micro_batches


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
    with pytest.raises(ValueError, match=">= 1"):
        micro_batches([sample(1)], 0)
