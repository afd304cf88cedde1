"""The Landmark level on the real NLE: the stairs are hidden, the landmark's kind alone says where
they are, every layout is solvable by the rule and by nothing that ignores the landmark."""

from __future__ import annotations

from collections import Counter

import gymnasium
import numpy as np
import pytest

pytest.importorskip("nle")  # the minihack extra

import crl_bench  # noqa: E402,F401  (registers the crl/ envs)
from crl_bench.envs.minihack.env import MiniHackTextEnv  # noqa: E402
from crl_bench.envs.minihack.landmark import (  # noqa: E402
    COVER_OBJECT,
    LANDMARK_RULE,
    LANDMARKS,
    RING,
    landmark_des,
    landmark_layout,
    landmark_name,
)
from crl_bench.envs.minihack.language import DIRECTION_STEPS, DIRECTIONS  # noqa: E402
from crl_bench.registry import ENVS  # noqa: E402

ENV_ID = "crl/MiniHack-Room-Landmark-5x5-v0"


def _chars(env) -> np.ndarray:
    nle = env.unwrapped.nle_env
    return nle.last_observation[nle._observation_keys.index("chars")]


def test_it_is_registered_as_a_one_action_level_of_the_minihack_family() -> None:
    entry = ENVS.get(ENV_ID)
    assert entry.family == "minihack" and entry.kwargs["max_steps"] == 1


def test_the_layouts_are_balanced_and_the_landmark_square_is_independent_of_its_kind() -> None:
    """Any 8 consecutive seeds give each stairs direction once; the 128 seeds of one cycle give
    each (kind, ring square) pair once, so the landmark's own place carries no answer."""
    assert sorted(LANDMARK_RULE.values()) == sorted(DIRECTIONS)
    for start in (0, 5, 1_000_000, 2_000_003):
        assert sorted(landmark_layout(s)[2] for s in range(start, start + 8)) == sorted(DIRECTIONS)
    pairs = Counter((k, sq) for k, sq, _ in map(landmark_layout, range(128)))
    assert len(pairs) == 128 and set(pairs.values()) == {1}
    assert {sq for _, sq, _ in map(landmark_layout, range(128))} == set(RING)
    assert landmark_des(9) == landmark_des(9 + 128) != landmark_des(10)
    with pytest.raises(ValueError, match="non-negative"):
        landmark_layout(-1)
    with pytest.raises(ValueError, match="kinds are"):
        landmark_name("statue")


@pytest.mark.parametrize("view", ["compact", "full"])
def test_the_observation_names_the_landmark_and_never_the_stairs(view: str) -> None:
    """In the game's own map (NLE ``chars``) the eight squares around ``@`` all show the rock
    (``*``) and no ``>`` is drawn; the text lists eight identical rocks, the landmark once, and
    no staircase."""
    env = gymnasium.make(ENV_ID, view=view)
    for seed in range(0, 24, 3):
        obs, info = env.reset(seed=seed)
        kind, _, _ = landmark_layout(seed)
        chars = _chars(env)
        (ay, ax), = np.argwhere(chars == ord("@"))
        around = {chr(chars[ay + dy, ax + dx]) for dx, dy in DIRECTION_STEPS}
        assert around == {"*"} and not (chars == ord(">")).any()
        assert "staircase" not in obs
        rocks = [line for line in obs.splitlines() if line.startswith(f"- {COVER_OBJECT} ")]
        assert sorted(rocks) == sorted(f"- {COVER_OBJECT} (object): adjacent {d}"
                                       for d in DIRECTIONS)
        assert sum(line.startswith(f"- {landmark_name(kind)}") for line in obs.splitlines()) == 1
        assert "landmark" in info["goal"] and "rocks" in info["goal"]
    env.close()


def test_only_the_move_the_rule_gives_solves_a_level() -> None:
    """For every landmark kind, the move ``LANDMARK_RULE[kind]`` reaches the stairs in the single
    action and each of the 7 other moves fails (no reward, no success)."""
    env = gymnasium.make(ENV_ID, view="compact")
    for seed in [3, 1_000_011, 8, 17, 4, 2_000_005, 6, 15, 1]:
        kind, _, answer = landmark_layout(seed)
        for move in DIRECTIONS:
            env.reset(seed=seed)
            _, reward, terminated, truncated, info = env.step(move)
            assert terminated or truncated
            assert info["success"] == (move == answer) == (reward > 0), (seed, kind, move)
    env.close()


@pytest.mark.parametrize("view", ["compact", "full"])
def test_moving_the_stairs_under_another_rock_leaves_the_observation_unchanged(view: str) -> None:
    """No leak: the same room with the stairs under a different rock gives the same text, so
    nothing but the landmark (through the rule) can tell where they are."""
    seed = 12
    des = landmark_des(seed)
    stair_line = next(line for line in des.splitlines() if line.startswith("STAIR:"))
    texts = set()
    for dx, dy in DIRECTION_STEPS[:3]:
        moved = des.replace(stair_line, f"STAIR:({3 + dx},{3 + dy}),down")
        env = MiniHackTextEnv("MiniHack-Navigation-Custom-v0", max_steps=1, view=view,
                              des_file=moved)
        obs, _ = env.reset(seed=seed)
        texts.add(obs.split("Message:")[0])
        env.close()
    assert len(texts) == 1


def test_landmark_kinds_all_appear_under_their_names() -> None:
    """Each of the 8 kinds is drawn and named (the des statements compile and NetHack shows them
    as :data:`LANDMARKS` says)."""
    env = gymnasium.make(ENV_ID, view="compact")
    for seed in range(len(LANDMARKS)):
        obs, _ = env.reset(seed=seed)
        assert f"- {landmark_name(LANDMARKS[seed][0])}" in obs, (seed, obs)
    env.close()


def test_the_benchmark_floors_are_one_eighth_and_the_rule_is_the_ceiling() -> None:
    """``experiments/minihack_landmark.py --baselines`` on 16 held-out levels: every constant move
    and the move toward the landmark score exactly 2/16 (each direction twice), the rule 16/16."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "experiments"))
    from minihack_landmark import baselines

    b = baselines(list(range(1_000_000, 1_000_016)), seed=0, view="compact")
    constants = [r["k"] for n, r in b["policies"].items() if n.startswith("always ")]
    assert constants == [2] * 8 and b["best_constant"]["k"] == 2
    assert b["policies"]["toward the landmark"]["k"] == 2
    assert b["ceiling"]["k"] == 16 and b["chance"]["n"] == 16


@pytest.mark.slow
def test_follow_counts_the_claim_and_the_example_from_what_the_real_actor_sent(tmp_path) -> None:
    """``experiments/minihack_landmark.py --follow`` with the embedded actor on 4 held-out levels:
    under a right claim, sending the claim's move is exactly solving the level; under a wrong
    one (the next move clockwise), never; each count is read from the episodes actually played."""
    import json
    import sys
    from pathlib import Path

    pytest.importorskip("torch")
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "experiments"))
    from minihack_landmark import FOLLOW_CONDITIONS, main

    out = tmp_path / "follow.json"
    assert main(["--follow", "--levels", "4", "--samples", "2", "--set", "threads=1",
                 "--set", "rollout.history=0", "--set", "rollout.example_pick=random",
                 "--out", str(out)]) == 0
    rows = {(r["example"], r["claim"]): r for r in json.loads(out.read_text())["follow"]["rows"]}
    assert set(rows) == {(p, c or "none") for p, c in FOLLOW_CONDITIONS}
    assert all(r["success"]["n"] == 8 for r in rows.values())
    for pick in ("random", "none"):
        assert rows[(pick, "right")]["sent_claim"]["k"] == rows[(pick, "right")]["success"]["k"]
        assert rows[(pick, "none")]["sent_claim"] is None
    wrong = rows[("random", "wrong")]
    assert wrong["success"]["k"] + wrong["sent_claim"]["k"] <= wrong["valid_move"]["k"]
    assert rows[("none", "none")]["sent_example"]["k"] == 0  # no example shown: none sent
    # the example shown is one of the moves: an episode that sent it sent a valid move
    assert rows[("random", "none")]["sent_example"]["k"] <= rows[("random", "none")]["valid_move"]["k"]
