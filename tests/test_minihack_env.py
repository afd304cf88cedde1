"""MiniHack text envs on the real NLE: contract, seeding, actions, episode ends, scripted agent."""

from __future__ import annotations

import os
import random
import subprocess
import sys
import warnings

import gymnasium
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

pytest.importorskip("nle")  # the minihack extra; MiniHack itself is imported through our shim

import crl_bench  # noqa: E402,F401  (registers the crl/ envs)
from crl_bench.env_check import check_text_env  # noqa: E402
from crl_bench.envs.minihack.env import MiniHackTextEnv  # noqa: E402
from crl_bench.envs.minihack.language import DIRECTION_STEPS, DIRECTIONS  # noqa: E402
from crl_bench.envs.minihack.scripted import (  # noqa: E402
    ScriptedTextAgent,
    parse_observation,
    play_episode,
    success_rate,
)
from crl_bench.registry import ENVS  # noqa: E402

MINIHACK_IDS = sorted(name for name in ENVS.names() if ENVS.get(name).family == "minihack")
REQUIRED_IDS = {f"crl/MiniHack-Room-{v}{s}x{s}-v0" for s in (5, 15)
                for v in ("", "Random-", "Dark-", "Monster-", "Trap-", "Ultimate-")}
REQUIRED_IDS |= {"crl/MiniHack-Corridor-R3-v0", "crl/MiniHack-MazeWalk-9x9-v0"}


def _agent_position(env: MiniHackTextEnv) -> tuple[int, int]:
    """Test-only peek at NLE's blstats (agents never get this)."""
    blstats = env.nle_env.last_observation[env.nle_env._blstats_index]
    return int(blstats[0]), int(blstats[1])


def _level_glyphs(env: MiniHackTextEnv) -> bytes:
    return env.nle_env.last_observation[env.nle_env._glyph_index].tobytes()


# -- registration ------------------------------------------------------------------------------

def test_the_required_tasks_are_registered_lazily_with_the_minihack_extra() -> None:
    assert REQUIRED_IDS <= set(MINIHACK_IDS)
    for env_id in MINIHACK_IDS:
        entry = ENVS.get(env_id)
        assert entry.extra == "minihack"
        assert entry.entry_point == "crl_bench.envs.minihack.env:MiniHackTextEnv"
        assert entry.kwargs["task"] == env_id.removeprefix("crl/")
    assert ENVS.get("crl/MiniHack-Room-Ultimate-5x5-v0").kwargs["max_steps"] == 30


def test_importing_crl_bench_does_not_import_nle() -> None:
    code = ("import sys, crl_bench; from crl_bench.registry import ENVS; "
            "assert 'crl/MiniHack-Room-5x5-v0' in ENVS; "
            "heavy = [m for m in ('nle', 'minihack') if m in sys.modules]; "
            "assert not heavy, heavy")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_gymnasium_make_works_after_importing_crl_bench() -> None:
    env = gymnasium.make("crl/MiniHack-Room-5x5-v0")
    obs, info = env.reset(seed=0)
    assert isinstance(obs, str) and "staircase down" in obs
    assert info["admissible_actions"] == list(DIRECTIONS)
    assert isinstance(env.unwrapped, MiniHackTextEnv)
    env.close()


# -- the contract --------------------------------------------------------------------------------

@pytest.mark.parametrize("env_id", MINIHACK_IDS)
def test_check_text_env_passes_without_warnings(env_id: str) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # any warning at all fails the test
        # gymnasium's check_env takes truncation after one step for a broken env; the one-action
        # level (Adjacent-3x3) is checked with two
        kwargs = {"max_steps": 2} if ENVS.get(env_id).kwargs["max_steps"] == 1 else None
        report = check_text_env(env_id, seed=3, make_kwargs=kwargs)
    assert len(report.checks) == 7  # gym, reset, fuzz+clean text, options, episode end, determinism, close


# -- seeding -------------------------------------------------------------------------------------

def test_same_seed_and_actions_give_identical_observations_and_rewards() -> None:
    rng = random.Random(5)
    actions = [rng.choice(DIRECTIONS) for _ in range(40)]
    traces = []
    for _ in range(2):
        env = MiniHackTextEnv("MiniHack-Room-Ultimate-15x15-v0", max_steps=60)  # monsters move
        trace = [env.reset(seed=11)[0]]
        for a in actions:
            obs, reward, terminated, truncated, info = env.step(a)
            trace.append((obs, reward, terminated, truncated, info["success"]))
            if terminated or truncated:
                break
        traces.append(trace)
        env.close()
    assert traces[0] == traces[1]
    assert len(traces[0]) > 10


_TRAJECTORY_DIGEST = """
import hashlib, random
from crl_bench.envs.minihack.env import MiniHackTextEnv
env = MiniHackTextEnv("MiniHack-Room-Ultimate-15x15-v0", max_steps=100)
rng, digest = random.Random(0), hashlib.sha256()
for episode in range(3):
    obs, _ = env.reset(seed=episode)
    digest.update(obs.encode())
    for _ in range(100):
        obs, r, te, tr, _ = env.step(rng.choice(env.admissible_actions))
        digest.update(f"{obs}|{r}|{te}|{tr}".encode())
        if te or tr:
            break
print(digest.hexdigest())
"""


def test_trajectories_are_identical_across_processes() -> None:
    # catches dependence on the clock, the process or hash randomisation
    digests = {subprocess.run([sys.executable, "-c", _TRAJECTORY_DIGEST], check=True,
                              capture_output=True, text=True,
                              env={**os.environ, "PYTHONHASHSEED": str(h)}).stdout
               for h in (1, 2)}
    assert len(digests) == 1


def test_task_id_is_the_level_seed() -> None:
    env = MiniHackTextEnv("MiniHack-Room-Random-15x15-v0")
    _, info = env.reset(seed=7)
    assert info["task_id"] == "7"
    level_7 = _level_glyphs(env)
    _, info = env.reset(seed=123, options={"task_id": "7"})  # other game seeds, same level
    assert info["task_id"] == "7" and _level_glyphs(env) == level_7
    env.reset(seed=8)
    assert _level_glyphs(env) != level_7
    _, info = env.reset(options={"task_id": 7})
    assert info["task_id"] == "7" and _level_glyphs(env) == level_7
    _, info = env.reset()  # level seed drawn from np_random
    assert info["task_id"].isdigit()
    env.close()


@pytest.mark.parametrize("bad", ["abc", "-1", "1.5", 2**63, 1.0, True, ["1"]])
def test_a_bad_task_id_is_a_clear_error(bad: object) -> None:
    env = MiniHackTextEnv()
    with pytest.raises(ValueError, match="task_id"):
        env.reset(options={"task_id": bad})
    env.close()


def test_an_unknown_task_names_the_known_ones() -> None:
    with pytest.raises(ValueError, match="MiniHack-Room-5x5-v0"):
        MiniHackTextEnv("MiniHack-Nowhere-v0")


# -- actions -------------------------------------------------------------------------------------

def test_each_action_word_moves_the_way_it_is_named() -> None:
    # Room-15x15 starts in the room's top-left corner; three steps southeast leave room to
    # move one square in every direction.
    env = MiniHackTextEnv("MiniHack-Room-15x15-v0", max_steps=20)
    env.reset(seed=0)
    for _ in range(3):
        env.step("southeast")
    for word, (dx, dy) in zip(DIRECTIONS, DIRECTION_STEPS):
        x, y = _agent_position(env)
        _obs, _r, terminated, _t, info = env.step(word)
        assert info["action_valid"] and not terminated
        assert _agent_position(env) == (x + dx, y + dy), word
    env.close()


def test_an_unknown_action_is_feedback_that_uses_a_step_but_not_the_game() -> None:
    env = MiniHackTextEnv("MiniHack-Room-5x5-v0", max_steps=3)
    first, _ = env.reset(seed=0)
    nle_steps = env.nle_env._steps
    obs, reward, terminated, truncated, info = env.step("fly away")
    assert obs.startswith("Unknown action 'fly away': nothing happened. Valid actions: north,")
    assert obs.endswith(first)  # the unchanged description follows the feedback
    assert (reward, terminated, truncated, info["action_valid"]) == (0.0, False, False, False)
    assert env.nle_env._steps == nle_steps
    env.step("  North ")  # case and spaces do not matter
    assert env.nle_env._steps == nle_steps + 1
    obs, _r, terminated, truncated, info = env.step("x" * 10_000)
    assert truncated and not terminated and not info["action_valid"]
    assert "Outcome: you used all 3 actions." in obs
    assert len(obs) < 2_000  # the echoed action is cut short


def test_compound_actions_answer_the_direction_prompt() -> None:
    env = MiniHackTextEnv("MiniHack-Corridor-R3-v0")
    _obs, info = env.reset(seed=3)
    assert "open north" in info["admissible_actions"] and "search" in info["admissible_actions"]
    before = env.nle_env._steps
    obs, _r, _te, _tr, info = env.step("open north")
    assert info["action_valid"] and env.nle_env._steps == before + 2
    assert "In what direction?" not in obs
    env.close()


@pytest.fixture(scope="module")
def fuzz_env():
    env = MiniHackTextEnv("MiniHack-Room-Monster-5x5-v0", max_steps=15)
    env.reset(seed=1)
    yield env
    env.close()


@settings(max_examples=60, deadline=None)
@given(action=st.one_of(st.text(max_size=60), st.sampled_from(DIRECTIONS),
                        st.builds(lambda d: f" {d.upper()}\t", st.sampled_from(DIRECTIONS))))
def test_fuzzed_actions_are_feedback_never_exceptions(fuzz_env: MiniHackTextEnv,
                                                      action: str) -> None:
    obs, reward, terminated, truncated, info = fuzz_env.step(action)
    assert isinstance(obs, str) and isinstance(reward, float)
    valid = " ".join(action.lower().split()) in info["admissible_actions"]
    assert info["action_valid"] == valid
    if terminated or truncated:
        fuzz_env.reset(seed=1)


# -- episode ends --------------------------------------------------------------------------------

def test_reaching_the_stairs_is_success_with_minihack_s_reward() -> None:
    env = MiniHackTextEnv("MiniHack-Room-5x5-v0")
    env.reset(seed=0)
    rewards = []
    for _ in range(4):  # start in the top-left corner, stairs in the bottom-right one
        obs, reward, terminated, truncated, info = env.step("southeast")
        rewards.append(reward)
    assert rewards == [0.0, 0.0, 0.0, 1.0]
    assert terminated and not truncated
    assert info["success"] is True and info["score"] == 1.0
    assert info["end_status"] == "TASK_SUCCESSFUL"
    assert obs.endswith("Outcome: you reached the goal. Task complete.")
    obs, reward, terminated, _t, info = env.step("north")  # after the end: feedback, no error
    assert terminated and reward == 0.0 and not info["action_valid"]
    env.close()


def test_the_step_cap_truncates_and_bumping_costs_minihack_s_time_penalty() -> None:
    env = gymnasium.make("crl/MiniHack-Room-15x15-v0")  # registered with the paper's 30 steps
    env.reset(seed=0)
    for i in range(30):
        obs, reward, terminated, truncated, info = env.step("west")  # into the rock, every time
        assert reward == pytest.approx(-0.01)
        assert truncated == (i == 29) and not terminated
    assert info["success"] is False and info["score"] == 0.0
    assert "It's solid stone." in obs and "Outcome: you used all 30 actions. Task failed." in obs
    env.close()


def _fight_the_nearest_monster(observation: str) -> str:
    """Text-only policy that walks into the nearest monster (to get killed, eventually)."""
    order = ["adjacent", "very near", "near", "far", "very far"]
    monsters = [s for s in parse_observation(observation).sightings if s.kind == "monster"]
    return min(monsters, key=lambda s: order.index(s.distance)).direction if monsters else "north"


def test_death_ends_the_episode_as_a_failure() -> None:
    env = gymnasium.make("crl/MiniHack-Room-Monster-15x15-v0", max_steps=100)
    for seed in range(20):
        obs, info = env.reset(seed=seed)
        terminated = truncated = False
        while not (terminated or truncated):
            obs, reward, terminated, truncated, info = env.step(_fight_the_nearest_monster(obs))
        if info["end_status"] == "DEATH":
            break
    else:
        pytest.fail("no death in 20 episodes of walking into monsters")
    assert terminated and not truncated and reward == 0.0  # MiniHack's reward_lose
    assert info["success"] is False and info["score"] == 0.0
    assert obs == "Outcome: you died. Task failed."
    env.close()


def test_render_and_map() -> None:
    env = MiniHackTextEnv("MiniHack-Room-5x5-v0", show_map=True, render_mode="ansi")
    obs, _ = env.reset(seed=0)
    assert "Map (you are @):\n@...." in obs
    assert env.render() == obs
    env.close()
    env.close()  # closing twice is allowed


# -- the scripted agent: the text carries what is needed ----------------------------------------

def test_the_parser_reads_the_env_s_text() -> None:
    env = MiniHackTextEnv("MiniHack-Room-Random-15x15-v0")
    obs, _ = env.reset(seed=4)
    parsed = parse_observation(obs)
    assert [s.name for s in parsed.sightings if s.name == "staircase down"] == ["staircase down"]
    assert set(parsed.open_runs) <= set(DIRECTIONS) and parsed.open_runs
    env.close()


@pytest.mark.parametrize("env_id", ["crl/MiniHack-Room-5x5-v0", "crl/MiniHack-Room-15x15-v0",
                                    "crl/MiniHack-Room-Random-5x5-v0",
                                    "crl/MiniHack-Room-Random-15x15-v0"])
def test_a_text_only_scripted_agent_reaches_the_goal(env_id: str) -> None:
    env = gymnasium.make(env_id)
    rate = success_rate(env, episodes=100, first_seed=1000)
    env.close()
    assert rate >= 0.95, f"{env_id}: scripted agent solved {rate:.0%} of 100 episodes"


def test_the_compact_view_names_the_way_to_the_stairs() -> None:
    """``view="compact"`` drops walls, open directions and health, and what is left is enough:
    walking where it names the staircase down solves lit random rooms, as on the full text."""
    compact = gymnasium.make("crl/MiniHack-Room-Random-5x5-v0", view="compact", max_steps=10)
    full = gymnasium.make("crl/MiniHack-Room-Random-5x5-v0", max_steps=10)
    solved = 0
    for seed in range(1000, 1030):
        obs, _ = compact.reset(seed=seed)
        full_obs, _ = full.reset(seed=seed)
        assert "Open directions" not in obs and "Health" not in obs
        assert set(obs.splitlines()) <= set(full_obs.splitlines())
        for _ in range(10):
            stairs = [s for s in parse_observation(obs).sightings if s.name == "staircase down"]
            obs, _, terminated, truncated, info = compact.step(stairs[0].direction)
            if terminated or truncated:
                break
        solved += info["success"]
    compact.close()
    full.close()
    assert solved == 30
    with pytest.raises(ValueError, match="full, compact"):
        MiniHackTextEnv("MiniHack-Room-5x5-v0", view="map")


@pytest.mark.parametrize("env_id", ["crl/MiniHack-Room-Adjacent-3x3-v0",
                                    "crl/MiniHack-Room-Adjacent-3x3-Balanced-v0"])
def test_the_adjacent_3x3_level_is_solved_by_reading_and_by_nothing_else(env_id) -> None:
    """Our own levels (MiniHack's des-file language): the game's own map (NLE ``chars``, not our
    text) has ``>`` next to ``@`` on every level, in all 8 directions over the levels; the move
    the observation names reaches it in the single action, and each of the 7 other moves fails
    (nothing else scores). The Balanced variant puts the stairs in direction ``seed mod 8`` (in
    the game's map, also when seeds are played out of order on one env)."""
    env = gymnasium.make(env_id, view="compact")
    assert env.unwrapped.max_steps == 1
    balanced = "Balanced" in env_id
    seen: set[str] = set()
    seeds = list(range(40)) if not balanced else [5, 1_000_003, 2, 2, 7, 0, 13, 4, 6, 9, 3, 11]
    for seed in seeds:
        obs, _ = env.reset(seed=seed)
        chars = env.unwrapped.nle_env.last_observation[
            env.unwrapped.nle_env._observation_keys.index("chars")]
        (ay, ax), = np.argwhere(chars == ord("@"))
        (sy, sx), = np.argwhere(chars == ord(">"))
        named = DIRECTIONS[DIRECTION_STEPS.index((int(sx - ax), int(sy - ay)))]
        assert obs.splitlines()[1] == f"- staircase down: adjacent {named}"
        if balanced:
            assert named == DIRECTIONS[seed % 8], (seed, named)
        seen.add(named)
        for move in DIRECTIONS:
            env.reset(seed=seed)
            _, reward, terminated, truncated, info = env.step(move)
            assert terminated or truncated
            assert info["success"] == (move == named) == (reward > 0), (seed, move, named)
    env.close()
    assert seen == set(DIRECTIONS)
    with pytest.raises(ValueError, match="own level"):
        MiniHackTextEnv("MiniHack-Room-Adjacent-3x3-v0", des_file="x")


def test_the_scripted_agent_explores_dark_rooms() -> None:
    env = gymnasium.make("crl/MiniHack-Room-Dark-5x5-v0")
    agent = ScriptedTextAgent(seed=0)
    results = [play_episode(env, agent, seed=s) for s in range(20)]
    env.close()
    assert sum(r.success for r in results) >= 18


def test_the_pkg_resources_stand_in_does_not_outlive_the_minihack_import() -> None:
    code = ("import sys; from crl_bench.envs.minihack.env import MiniHackTextEnv; "
            "env = MiniHackTextEnv(); env.reset(seed=0); env.step('east'); "
            "mod = sys.modules.get('pkg_resources'); "
            "assert mod is None or hasattr(mod, 'get_distribution'), mod")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_options_not_a_dict_is_a_type_error() -> None:
    env = MiniHackTextEnv("MiniHack-Room-5x5-v0")
    try:
        with pytest.raises(TypeError, match="must be a dict"):
            env.reset(options="notadict")
        env.reset(seed=0)  # still usable
    finally:
        env.close()


def test_reset_and_step_after_close_are_a_clear_error() -> None:
    env = MiniHackTextEnv("MiniHack-Room-5x5-v0")
    env.reset(seed=0)
    env.close()
    with pytest.raises(RuntimeError, match="after close"):
        env.step("north")
    with pytest.raises(RuntimeError, match="after close"):
        env.reset(seed=0)
    env.close()  # closing twice is fine


def test_steps_after_the_end_keep_it_ended_and_echo_nothing_raw() -> None:
    env = MiniHackTextEnv("MiniHack-Room-5x5-v0", max_steps=2)
    env.reset(seed=0)
    obs, *_ = env.step("look\x1b[31m\ud800")
    assert "\x1b" not in obs and "\\x1b" in obs and "\\ud800" in obs
    obs.encode("utf-8")
    final = env.step("zzz")
    assert final[3] is True
    for _ in range(2):
        obs, reward, terminated, truncated, info = env.step("north")
        assert obs.startswith(final[0]) and "episode is over" in obs
        assert (reward, terminated, truncated, info["action_valid"]) == (0.0, False, True, False)
    env.close()
