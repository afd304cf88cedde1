"""The reader's warm-start data (crl_bench.builds.reader) carries no information about the
Landmark rule: its moves are drawn from the recipe's seed alone, and the data check that the
build enforces finds no observation feature that predicts the target better than chance — and
does find one in data that carries the rule."""

from __future__ import annotations

import dataclasses

import pytest

pytest.importorskip("nle")


@pytest.fixture(scope="module")
def data():
    from crl_bench.builds.reader import RECIPE, examples

    return examples(RECIPE, n=96)


def test_targets_do_not_depend_on_the_level(data):
    """The same recipe on other levels (other landmarks, other rings) draws the same conditions,
    claims and targets: nothing of the level enters them."""
    from crl_bench.builds.reader import RECIPE, examples

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
    from crl_bench.builds.reader import data_check, data_check_passes

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
    from crl_bench.builds.reader import data_check, data_check_passes

    rule = [dataclasses.replace(e, target=e.rule) for e in data]
    assert any("the rule's move" in f for f in data_check_passes(data_check(rule)))
    table = {k: random.Random(k).choice(DIRECTIONS) for k in {e.landmark for e in data}}
    by_kind = [dataclasses.replace(e, target=table[e.landmark]) for e in data]
    assert any("the landmark predicts" in f for f in data_check_passes(data_check(by_kind)))


def test_the_feature_check_sees_every_value_in_both_halves(data):
    """Consecutive levels cycle through the landmark kinds; the cross-validation halves must
    still each hold every kind (a split by position would put the even kinds in one half and
    predict nothing, passing any data)."""
    from crl_bench.builds.reader import data_check

    check = data_check(data)
    for name in ("landmark", "ring"):
        # chance-level data still gets about one hit in eight, not none
        assert check["all"]["features"][name]["hits"] >= 96 // 16


def test_success_entries_come_with_a_failure_twin(data):
    """Each success prompt is followed by a failure prompt on the same level naming the same
    move, whose target is another move: only the entry's stem (and title) tells them apart."""
    twins = [(a, b) for a, b in zip(data, data[1:]) if a.condition == "success"]
    assert twins and all(b.condition == "failure" and b.level == a.level
                         and b.claim.lower() == a.target and b.target != a.target
                         for a, b in twins)
