"""ALFWorld env on the real games and the real TextWorld engine: the text-env contract, fuzzed
actions, rewards and limits, task ids and task-type filters, the engine against plain TextWorld
(as ALFWorld runs it), the game store, the planner and ``crl-bench play``."""

from __future__ import annotations

import io
import sys
import threading
from collections import Counter
from pathlib import Path

import gymnasium
import pytest
from _data_paths import missing_data_reason, shared_data_dir
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import crl_bench  # noqa: F401  (registers the envs)
from crl_bench.env_check import check_text_env

pytest.importorskip("textworld", reason="the alfworld extra is not installed")
pytest.importorskip("alfworld", reason="the alfworld extra is not installed")

DATA = shared_data_dir("alfworld")
pytestmark = pytest.mark.skipif(DATA is None, reason=missing_data_reason("alfworld"))

EVAL_ID = "crl/ALFWorld-ValidUnseen-v0"
# A heat game: 6 walkthrough steps, every kind of command but "use" and "clean".
HEAT_GAME = ("valid_unseen/pick_heat_then_place_in_recep-Potato-None-GarbageCan-10/"
             "trial_T20190907_161853_945788")


def make_env(**kwargs):
    from crl_bench.envs.alfworld.env import ALFWorldTextEnv

    kwargs.setdefault("split", "valid_unseen")
    return ALFWorldTextEnv(data_dir=DATA, **kwargs)


@pytest.fixture(scope="module")
def env():
    e = make_env()
    yield e
    e.close()


def test_check_text_env_passes_on_the_evaluation_split() -> None:
    report = check_text_env(EVAL_ID, make_kwargs={"data_dir": str(DATA)})
    assert len(report.checks) == 7  # gym, reset, fuzz+clean text, options, episode end, determinism, close


def test_registered_ids_and_kwargs() -> None:
    from crl_bench.registry import ENVS

    ids = [n for n in ENVS.names() if n.startswith("crl/ALFWorld")]
    assert len(ids) == 10
    e = gymnasium.make("crl/ALFWorld-PickTwo-v0", split="valid_unseen", data_dir=str(DATA),
                       max_steps=7)
    u = e.unwrapped
    assert u.split == "valid_unseen" and u.max_steps == 7
    assert len(u.games) == 17 and {g.task_type for g in u.games} == {"pick_two_obj_and_place"}
    e.close()


def test_reset_gives_alfworld_text_goal_and_admissible_commands(env) -> None:
    obs, info = env.reset(options={"task_id": HEAT_GAME})
    assert obs.startswith("-= Welcome to TextWorld, ALFRED! =-\n\nYou are in the middle of a room.")
    assert obs.endswith("Your task is to: put a hot potato in garbagecan.")
    assert info["goal"] == "put a hot potato in garbagecan."
    assert info["task_id"] == HEAT_GAME
    assert info["task_type"] == "pick_heat_then_place_in_recep" and info["task_type_id"] == 4
    assert info["split"] == "valid_unseen" and info["steps"] == 0
    assert not info["success"] and info["score"] == 0.0 and info["action_valid"]
    actions = info["admissible_actions"]
    assert {"look", "inventory", "help", "go to microwave 1", "go to garbagecan 1"} <= set(actions)
    assert actions == sorted(actions)


def test_walkthrough_wins_with_plus_one(env) -> None:
    _obs, info = env.reset(options={"task_id": HEAT_GAME})
    commands = env.walkthrough()
    assert commands == ["go to countertop 2", "take potato 2 from countertop 2",
                        "go to microwave 1", "heat potato 2 with microwave 1",
                        "go to garbagecan 1", "move potato 2 to garbagecan 1"]
    rewards = []
    for i, command in enumerate(commands):
        assert command in info["admissible_actions"]
        obs, reward, terminated, truncated, info = env.step(command)
        rewards.append(reward)
        assert info["action_valid"] and not truncated and info["steps"] == i + 1
        assert terminated == (i == len(commands) - 1)
    assert obs == "You move the potato 2 to the garbagecan 1."
    assert rewards == [0.0] * 5 + [1.0]
    assert info["success"] and info["score"] == 1.0
    final = obs
    for _ in range(2):  # after the end: the text-env convention (crl_bench.text_env)
        obs, reward, terminated, truncated, info = env.step("look")
        assert obs.startswith(final) and "episode is over" in obs and reward == 0.0
        assert (terminated, truncated) == (True, False)
        assert not info["action_valid"] and info["success"]


def test_invalid_commands_are_alfworld_feedback(env) -> None:
    _obs, info = env.reset(options={"task_id": HEAT_GAME})
    before = info["admissible_actions"]
    for action in ("go to the moon", "Go to microwave 1", "go to microwave 1.", "", "x" * 10_000,
                   b"look\xff", 3.5, None):
        obs, reward, terminated, truncated, info = env.step(action)
        assert obs == "Nothing happens."
        assert not info["action_valid"] and reward == 0.0 and not (terminated or truncated)
        assert info["admissible_actions"] == before
    obs, _r, _t, _tr, info = env.step("  go to microwave 1\n")  # ALFWorld strips white space
    assert obs == "You arrive at microwave 1. The microwave 1 is closed." and info["action_valid"]
    assert info["steps"] == 9


@settings(max_examples=25, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(actions=st.lists(st.one_of(st.text(max_size=60),
                                  st.sampled_from(["look", "inventory", "go to fridge 1",
                                                   "open fridge 1", "help",
                                                   "take potato 2 from countertop 2"])),
                        min_size=1, max_size=6))
def test_fuzzed_actions_never_raise(env, actions) -> None:
    _obs, info = env.reset(options={"task_id": HEAT_GAME})
    for action in actions:
        admissible = info["admissible_actions"]
        obs, reward, _terminated, _truncated, info = env.step(action)
        assert isinstance(obs, str) and obs
        assert info["action_valid"] == (action.strip() in admissible)
        assert reward in (0.0, 1.0)


def test_step_cap_truncates_with_the_timeout_penalty() -> None:
    e = make_env(max_steps=3, timeout_penalty=0.5, prefetch=False)
    e.reset(options={"task_id": HEAT_GAME})
    results = [e.step(a) for a in ("look", "nonsense", "inventory")]
    assert [r[1] for r in results] == [0.0, 0.0, -0.5]
    assert [r[3] for r in results] == [False, False, True] and not any(r[2] for r in results)
    assert results[-1][4]["steps"] == 3 and not results[-1][4]["success"]
    e.close()
    with pytest.raises(ValueError, match="timeout_penalty"):
        make_env(timeout_penalty=-1.0)
    with pytest.raises(ValueError, match="max_steps"):
        make_env(max_steps=0)


def test_task_ids_and_seeded_sampling(env) -> None:
    ids = env.task_ids()
    assert len(ids) == 134 and HEAT_GAME in ids
    short = HEAT_GAME.split("/", 1)[1]  # the split prefix may be left out
    assert env.reset(options={"task_id": short})[1]["task_id"] == HEAT_GAME
    with pytest.raises(ValueError, match="task_ids"):
        env.reset(options={"task_id": "train/pick_and_place_simple-Mug-None-Desk-1/trial_x"})
    drawn = [env.reset(seed=s)[1]["task_id"] for s in range(3)]
    assert drawn == [env.reset(seed=s)[1]["task_id"] for s in range(3)]
    assert len(set(drawn)) == 3
    env.reset(seed=0)
    follow = [env.reset()[1]["task_id"] for _ in range(2)]
    env.reset(seed=0)
    assert [env.reset()[1]["task_id"] for _ in range(2)] == follow


def test_task_type_filter_is_in_info() -> None:
    e = make_env(task_types=["look", "pick_two"])
    assert Counter(g.task_type for g in e.games) == {"look_at_obj_in_light": 18,
                                                     "pick_two_obj_and_place": 17}
    seen = {e.reset(seed=s)[1]["task_type"] for s in range(3)}
    assert seen == {"look_at_obj_in_light", "pick_two_obj_and_place"}
    with pytest.raises(ValueError, match="not a game"):
        e.reset(options={"task_id": HEAT_GAME})
    e.close()


def _trace(game, commands):
    state = game.reset()
    out = [(state.feedback, state["admissible_commands"], state["won"])]
    for command in list(commands) + ["look", "not a command"]:
        state, _score, _done = game.step(command)
        out.append((state.feedback, state["admissible_commands"], state["won"]))
    return out


def test_engine_plays_exactly_like_textworld_with_alfworld_wrappers(env, monkeypatch) -> None:
    """Our prepared games (cached translation, memoized parses) against textworld.start with
    alfworld's AlfredDemangler, as alfworld's own env plays them: same texts, same commands."""
    import textworld
    from alfworld.agents.environment.alfred_tw_env import AlfredDemangler
    from crl_bench.envs.alfworld import engine

    monkeypatch.setattr(sys, "argv", list(sys.argv))  # textworld's pddl2sas overwrites argv
    paths = {g.task_id: str(g.path) for g in env.games}
    chosen = [  # small rooms (kitchens are slow for plain TextWorld): a pick-two and a clean game
        ("valid_unseen/pick_two_obj_and_place-SoapBar-None-GarbageCan-424/"
         "trial_T20190909_064053_839817"),
        ("valid_unseen/pick_clean_then_place_in_recep-Cloth-None-CounterTop-424/"
         "trial_T20190908_100632_546757")]
    engine.game_store().wait_idle(timeout=120)
    reference = []
    with engine.PARSE_LOCK:  # plain TextWorld shares TatSu parsers with our prefetch thread
        engine.uninstall_textgen_speedups()
        for task_id in chosen:
            tw = textworld.start(paths[task_id], request_infos=textworld.EnvInfos(
                won=True, admissible_commands=True), wrappers=[AlfredDemangler()])
            reference.append(_trace(tw, tw.walkthrough))
            tw.close()
    argv = list(sys.argv)
    ours = []
    game = engine.new_alfred_game()
    for task_id in chosen:
        prepared = engine.prepare_game(paths[task_id])
        game.use(prepared)
        ours.append(_trace(game, prepared.walkthrough))
        assert _trace(game, prepared.walkthrough) == ours[-1]  # a second reset replays the same
    game.close()
    assert sys.argv == argv  # our translation leaves argv alone
    assert engine._textgen_speedups  # installed again by prepare_game
    for ref, mine in zip(reference, ours):
        assert ref == mine
        assert ref[-3][2] is True  # the walkthrough won


def test_translation_matches_fast_downward_pddl2sas(env, monkeypatch) -> None:
    import json

    import fast_downward
    from crl_bench.envs.alfworld.engine import TRANSLATE_LOCK, translate_pddl

    monkeypatch.setattr(sys, "argv", list(sys.argv))
    data = json.loads(Path(env.games[40].path).read_text())
    for optimize in (False, True):
        _t1, ours = translate_pddl(data["pddl_domain"], data["pddl_problem"], optimize=optimize)
        with TRANSLATE_LOCK:  # pddl2sas sets the translator's global options, as we do
            _t2, theirs = fast_downward.pddl2sas(data["pddl_domain"], data["pddl_problem"],
                                                 optimize=optimize)
        assert ours == theirs


def test_game_store_lru_prefetch_and_errors(env, capsys) -> None:
    from crl_bench.envs.alfworld.engine import GameStore

    store = GameStore(capacity=2, prefetch_limit=2)
    paths = [str(g.path) for g in env.games[:3]]
    assert store.prefetch(paths) == 2  # the limit
    lines = []
    while store._pending:  # the main thread keeps printing while the background thread works
        print("main thread line")
        lines.append(1)
        threading.Event().wait(0.01)
    assert store.wait_idle(timeout=60)
    assert paths[0] in store and paths[1] in store and store.misses == 0
    out = capsys.readouterr().out
    assert out.count("main thread line") == len(lines) and "Instantiating" not in out
    first = store.get(paths[0])
    assert store.hits == 1 and first.walkthrough and first.prepare_seconds > 0
    store.get(paths[2])  # evicts the least recently used (paths[1])
    assert paths[1] not in store and len(store) == 2 and store.misses == 1
    assert store.get(paths[0]) is first
    store.prefetch(["/nonexistent/game.tw-pddl"])
    store.wait_idle(timeout=10)
    with pytest.raises(FileNotFoundError):
        store.get("/nonexistent/game.tw-pddl")
    with pytest.raises(ValueError, match="capacity"):
        GameStore(capacity=0)


def test_reset_prefetches_the_next_unseeded_draw() -> None:
    from crl_bench.envs.alfworld.engine import game_store

    e = make_env(task_types="look")
    e.reset(seed=123)
    store = game_store()
    assert store.wait_idle(timeout=60)
    hits = store.hits
    e.reset()
    assert store.hits == hits + 1
    e.close()


def test_planner_expert_wins_a_game(env) -> None:
    from crl_bench.envs.alfworld.expert import replay_planner

    task_id = env.task_ids()[0]  # a look_at_obj_in_light game, 4 steps
    episode = replay_planner(env, task_id, max_actions=10)
    assert episode.won and episode.invalid_actions == 0 and episode.total_reward == 1.0


def test_crl_bench_play_solves_a_game(monkeypatch, capsys) -> None:
    from crl_bench.cli import main

    commands = make_env(prefetch=False)
    commands.reset(options={"task_id": HEAT_GAME})
    typed = "\n".join(["open the door"] + commands.walkthrough()) + "\n"
    commands.close()
    monkeypatch.setattr(sys, "stdin", io.StringIO(typed))
    assert main(["play", EVAL_ID, "--task-id", HEAT_GAME, "--set", f"data_dir={DATA}"]) == 0
    out = capsys.readouterr().out
    assert "GOAL: put a hot potato in garbagecan." in out
    assert "(invalid action)" in out and "=== solved: success=True" in out


def test_options_not_a_dict_is_a_type_error(env) -> None:
    with pytest.raises(TypeError, match="must be a dict"):
        env.reset(options="notadict")
    obs, _info = env.reset(options={"task_id": HEAT_GAME})  # still usable
    assert "Your task is to" in obs


def test_truncation_keeps_the_episode_ended(env) -> None:
    env.reset(options={"task_id": HEAT_GAME})
    for _ in range(env.unwrapped.max_steps):
        obs, reward, terminated, truncated, info = env.step("\ud800\x1b[2J")
    assert truncated and not terminated and obs == "Nothing happens."
    obs, reward, terminated, truncated, info = env.step("look")
    assert (reward, terminated, truncated, info["action_valid"]) == (0.0, False, True, False)
    assert obs.startswith("Nothing happens.") and "episode is over" in obs
