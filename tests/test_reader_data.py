"""The reader's warm-start data (crl_bench.runner.reader) carries no information about the
Landmark rule: its moves are drawn from the recipe's seed alone, and the data check that the
build enforces finds no observation feature that predicts the target better than chance — and
does find one in data that carries the rule."""

from __future__ import annotations

import dataclasses

import pytest

pytest.importorskip("nle")


@pytest.fixture(scope="module")
def data():
    from crl_bench.runner.reader import RECIPE, examples

    return examples(RECIPE, n=96)


def test_targets_do_not_depend_on_the_level(data):
    """The same recipe on other levels (other landmarks, other rings) draws the same conditions,
    claims and targets: nothing of the level enters them."""
    from crl_bench.runner.reader import RECIPE, examples

    other = examples(RECIPE, n=24, first_level=3)
    assert [(e.condition, e.claim, e.target) for e in other] == \
        [(e.condition, e.claim, e.target) for e in data[:24]]
    assert [e.landmark for e in other] != [e.landmark for e in data[:24]]


def test_the_conditions_follow_the_recipe(data):
    from crl_bench.envs.minihack.language import DIRECTIONS

    assert {e.condition for e in data} == {"none", "success", "failure"}
    for e in data:
        assert e.target in DIRECTIONS
        if e.condition == "none":
            assert e.claim is None and e.experience_text == ""
        elif e.condition == "success":
            assert e.claim.lower() == e.target
            assert e.experience_text.endswith(f": what worked: To succeed, take the action {e.claim}.")
        else:
            assert e.claim.lower() != e.target
            assert e.experience_text.endswith(
                f": what went wrong: To avoid this failure, do not take the action {e.claim}.")


def test_no_feature_predicts_the_target_better_than_chance(data):
    from crl_bench.runner.reader import data_check, data_check_passes

    check = data_check(data)
    assert data_check_passes(check) == [], check
    assert check["all"]["n"] == 96
    # the rule's move is the target about one time in eight (not above chance)
    assert check["all"]["rule_target"]["p_above_chance"] > 0.05


def test_the_check_finds_data_that_carries_the_rule(data):
    """The check can fail: targets set to the rule's move, or to any fixed move per landmark
    kind, are caught."""
    import random

    from crl_bench.envs.minihack.language import DIRECTIONS
    from crl_bench.runner.reader import data_check, data_check_passes

    rule = [dataclasses.replace(e, target=e.rule) for e in data]
    assert any("the rule's move" in f for f in data_check_passes(data_check(rule)))
    table = {k: random.Random(k).choice(DIRECTIONS) for k in {e.landmark for e in data}}
    by_kind = [dataclasses.replace(e, target=table[e.landmark]) for e in data]
    assert any("the landmark predicts" in f for f in data_check_passes(data_check(by_kind)))
