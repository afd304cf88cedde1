"""The official MiniHack observation (``view="official"``) and the official prompt layout, on real
MiniHack levels.

Expected values are taken from the ComplementaryRL fork of ROLL at ab2574f (paths relative to it):

* ``roll/pipeline/agentic/env/minihack/env.py`` (``env.py``): ``_obs_to_text`` :526-590 (message,
  ``Dungeon view:`` + ``chars_crop``, legend), :383-394 (the action list after an action),
  :277-292 and :742-749 (the env instruction), :349-353 (an invalid action), :954-966 (names);
* ``roll/pipeline/agentic/env/minihack/utils.py`` (``utils.py``): :19-76 (legend over the whole
  screen), :210-271 (the crop's rows);
* ``examples/singletask-agentic/multitask_env_tool.yaml`` (``yaml``): :25-28 (system prompt),
  :65-69 (turn template), :263-279 (the launched MiniHack env: Room-Ultimate-5x5, its keys);
* ``roll/pipeline/agentic/env_manager/traj_env_manager.py`` (``manager``): :101-108 (memory
  header), :358-406 (the messages of a turn);
* ``roll/pipeline/agentic/tools/tool_env_wrapper.py`` :23-28 (tool text on the first observation);
* ``roll/pipeline/agentic/env_manager/memory_integration_mixin.py`` (``mixin``): :539-545,
  :576-592 (the gate's initial task prompt).

The crop, the legend and the message are checked against NLE's own arrays (``chars``,
``screen_descriptions``, ``blstats``, ``message``) of the state the text describes.
"""

from __future__ import annotations

import gymnasium
import numpy as np
import pytest

pytest.importorskip("nle")

import crl_bench  # noqa: E402,F401  (registers the crl/ envs)
from crl_bench.env_check import check_text_env  # noqa: E402
from crl_bench.llm.prompting import (  # noqa: E402
    ASK_INSTRUCTION,
    PromptConfig,
    build_followup_message,
    build_messages,
    official_task_prompt,
)
from crl_bench.config.schema import PRESETS, ConfigError, build_config  # noqa: E402

# --- expected text, copied from the official sources ---------------------------------------------
# env.py:288, :390-392 with the names of env.py:954-966 in MiniHack's navigation order (N E S W
# NE SE SW NW: minihack.base MiniHackNavigation's actions, the launched Room task's)
ACTIONS = "\nYour available actions are:\nnorth, east, south, west, northeast, southeast, southwest, northwest"
# env.py:742-749 + :288-292
INSTRUCTION = ("You are playing NetHack, a roguelike game. Navigate through the dungeon, avoid "
               "monsters, and reach the goal. Think carefully, then respond with exactly one action "
               "per turn using the format <think>[Your thoughts]</think><answer>[One of the actions "
               "in the action list]</answer>." + ACTIONS)
# yaml :25-28 (a `|` block: newline-joined lines, one final newline)
SYSTEM = ("You are navigating a maze with varied terrain and obstacles. Plan a route toward the "
          "down staircase (>),\navoiding dead ends, hazards (lava, ice, traps), and monsters. Watch "
          "for objects that might help.\nEvaluate alternate paths if blocked. Put your thoughts "
          "between <think> ... </think> tags. Respond with one action wrapped in <answer> ... "
          "</answer> tags.\n")
TURN = "Observation:\n{observation}\n\nThink carefully, then choose your next action:\n"  # yaml :65-69
MEMORY = ("\nBelow is distilled knowledge from earlier experiences.\nUse it to guide your actions "
          "without overfitting.\nSome insights may be overly specific, so identify only what is "
          "most relevant.\nKnowledge: \n{memory_message}\n                ")  # manager :101-108
LEGEND = ("The meaning of common symbols in the dungeon view is (same symbol may have different "
          "descriptions):")  # env.py:577-579
INVALID = "At turn 0, you did not provide a valid action."  # env.py:351 (turn counter stays 0, :327)
TOOL = "\nAvailable tools and their instructions:\n***Tool 1***\nTool Type: base\nTool Instruction: "

LEVELS = [("crl/MiniHack-Room-Ultimate-5x5-v0", s) for s in (0, 1, 2)] + [
    ("crl/MiniHack-Room-5x5-v0", 3), ("crl/MiniHack-Room-15x15-v0", 4),
    ("crl/MiniHack-Room-Monster-15x15-v0", 5), ("crl/MiniHack-Corridor-R2-v0", 6)]


def nle_arrays(env):
    """NLE's own arrays of the env's current state (its full last observation, every key)."""
    nle = env.unwrapped.nle_env
    return dict(zip(nle._observation_keys, nle.last_observation))


def window(chars, x, y, size=9):
    """The size x size window of ``chars`` centred on column x, row y; outside the map, blank."""
    half = size // 2
    rows = []
    for r in range(y - half, y + half + 1):
        line = ""
        for c in range(x - half, x + half + 1):
            inside = 0 <= r < chars.shape[0] and 0 <= c < chars.shape[1]
            v = int(chars[r, c]) if inside else 0
            line += " " if v in (0, 32) else chr(v)
        rows.append(line)
    return rows


def parse(text):
    """(message or None, crop rows or None, [(symbol, descriptions)]) of an official observation."""
    lines = text.split("\n")
    message = None
    if lines[0].startswith("Message: "):
        message = lines.pop(0)[len("Message: "):]
    crop = None
    if lines[0] == "" and lines[1] == "Dungeon view:":
        crop, lines = lines[2:11], lines[11:]
    assert lines[0] == LEGEND, text
    legend = []
    for line in lines[1:]:
        if not line:
            break
        symbol, _, rest = line.partition(": ")
        legend.append((symbol, eval(rest)))  # noqa: S307 - a printed Python list of str
    return message, crop, legend


def check_against_nle(text, arrays):
    chars, descs = arrays["chars"], arrays["screen_descriptions"]
    x, y = int(arrays["blstats"][0]), int(arrays["blstats"][1])
    message, crop, legend = parse(text)
    # the message is NLE's (env.py:531-534)
    nle_message = bytes(arrays["message"]).decode("utf-8", "ignore").rstrip("\0").strip()
    assert message == (nle_message or None)
    # the crop is the 9 x 9 window of NLE's chars around the agent (blstats 0, 1) (env.py:553-556)
    assert crop == window(chars, x, y)
    assert crop[4][4] == "@"
    # the legend lists exactly the symbols on the screen, first appearance first, each with the
    # sorted set of NLE's descriptions of its squares (utils.py:63-76)
    expected: dict[str, set[str]] = {}
    for r in range(chars.shape[0]):
        for c in range(chars.shape[1]):
            if int(chars[r, c]) in (0, 32):
                continue
            d = bytes(descs[r, c]).decode("utf-8", "replace").rstrip("\0").strip()
            assert d, f"NLE describes every shown square; {chr(chars[r, c])!r} at {r},{c} has none"
            expected.setdefault(chr(chars[r, c]), set()).add(d)
    assert [s for s, _ in legend] == list(expected)
    assert {s: sorted(d) for s, d in legend} == {s: sorted(d) for s, d in expected.items()}
    return crop, legend


@pytest.mark.parametrize("env_id,seed", LEVELS)
def test_official_observation_matches_nle_arrays_through_an_episode(env_id, seed):
    env = gymnasium.make(env_id, view="official")
    obs, info = env.reset(seed=seed)
    check_against_nle(obs, nle_arrays(env))
    assert "Your available actions" not in obs  # the first observation has none (env.py:325-333)
    rng = np.random.default_rng(seed)
    for _ in range(6):
        obs, _, terminated, truncated, info = env.step(str(rng.choice(info["admissible_actions"])))
        if terminated or truncated:
            break
        # Room: the official list (env.py:390-392); Corridor's door/kick/search commands keep
        # our words (one per direction), listed the same way
        listed = ACTIONS if "Room" in env_id else \
            "\nYour available actions are:\n" + ", ".join(info["admissible_actions"])
        assert obs.endswith(listed)
        check_against_nle(obs[:obs.index("\nYour available actions are:\n")], nle_arrays(env))
    env.close()


def test_legend_covers_the_whole_screen_not_only_the_crop():
    """utils.py:36-53: the full-size screen_descriptions pair with the full chars, so a symbol
    outside the 9 x 9 crop (the far staircase of a lit 15 x 15 room) is in the legend."""
    env = gymnasium.make("crl/MiniHack-Room-15x15-v0", view="official")
    for seed in range(10):
        obs, _ = env.reset(seed=seed)
        crop, legend = check_against_nle(obs, nle_arrays(env))
        if ">" not in "".join(crop):
            assert ">" in dict(legend) and dict(legend)[">"] == ["staircase down"]
            break
    else:
        pytest.fail("no level with the staircase outside the crop in 10 seeds")
    env.close()


def test_action_list_instruction_and_invalid_action_are_official():
    env = gymnasium.make("crl/MiniHack-Room-Ultimate-5x5-v0", view="official")
    first, info = env.reset(seed=0)
    assert info["admissible_actions"] == ACTIONS.split("\n")[-1].split(", ")
    official = info["official_prompt"]
    assert official == {"system": SYSTEM, "instruction": INSTRUCTION, "turn": TURN,
                        "memory": MEMORY}
    obs, reward, terminated, truncated, info = env.step("bogus")  # env.py:349-372
    assert obs == first + INVALID and reward == 0.0 and not info["action_valid"]
    obs, _, _, _, info = env.step("East")  # names are matched case-insensitively
    assert info["action_valid"] and obs.endswith("\n" + ACTIONS)  # legend's "\n" + the list
    again, _, _, _, _ = env.step("no such move")
    assert again == obs[:-len(ACTIONS)] + INVALID  # the last observation without the list
    env.close()


def test_official_view_keeps_the_text_env_contract():
    report = check_text_env("crl/MiniHack-Room-Ultimate-5x5-v0", seed=11,
                            make_kwargs={"view": "official"})
    assert len(report.checks) == 7  # it raises on the first broken rule


def test_official_observation_dict_has_the_official_keys_in_order():
    """yaml :275 + env.py:156-164: the observation dict (``info["raw_obs"]``, printed by the
    official MiniHack retrieval query, traj_env_manager.py:146-148) has exactly these keys."""
    env = gymnasium.make("crl/MiniHack-Room-Ultimate-5x5-v0", view="official")
    _, info = env.reset(seed=0)
    assert list(info["raw_obs"]) == ["glyphs", "message", "chars_crop", "glyphs_crop",
                                     "screen_descriptions", "chars"]
    env.close()
    with pytest.raises(ValueError, match="drop observation_keys"):
        gymnasium.make("crl/MiniHack-Room-5x5-v0", view="official", observation_keys=["chars"])


def test_other_views_are_unchanged_and_a_bad_view_names_the_choices():
    env = gymnasium.make("crl/MiniHack-Room-5x5-v0")
    obs, info = env.reset(seed=0)
    assert "Dungeon view" not in obs and "official_prompt" not in info
    env.close()
    with pytest.raises(ValueError, match="official"):
        gymnasium.make("crl/MiniHack-Room-5x5-v0", view="oficial")


# --- the prompt layout ------------------------------------------------------------------------
def first_turn(seed=0):
    env = gymnasium.make("crl/MiniHack-Room-Ultimate-5x5-v0", view="official")
    obs, info = env.reset(seed=seed)
    return env, obs, info


def test_official_first_turn_and_follow_up_messages():
    """manager :365-406: system = the maze template (+ "\\n" + memory header when memory was
    retrieved); first user message = instruction + "\\n" + turn template around the first
    observation with the tool text; later user messages = the turn template alone."""
    env, obs, info = first_turn()
    cfg = PromptConfig(conversation="full", layout="official", experience_place="system",
                       max_asks=2)
    kwargs = dict(family="minihack", goal=info["goal"], observation=obs, history=[],
                  admissible_actions=info["admissible_actions"], official=info["official_prompt"])
    tool = TOOL + ASK_INSTRUCTION.format(q=cfg.ask_tag, n=2) + "\n"
    messages = build_messages(cfg, experience_text="Go east first.", asks_left=2, **kwargs)
    assert messages == [
        {"role": "system", "content": SYSTEM + "\n" + MEMORY.format(memory_message="Go east first.")},
        {"role": "user", "content": INSTRUCTION + "\n" + TURN.format(observation=obs + tool)}]
    # no memory retrieved: the template alone (mixin :461-472); no asks offered: no tool text
    assert build_messages(cfg, experience_text="  ", asks_left=0, **kwargs) == [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": INSTRUCTION + "\n" + TURN.format(observation=obs)}]
    step_obs = env.step("north")[0]
    assert build_followup_message(cfg, observation=step_obs, admissible_actions=None,
                                  official=info["official_prompt"]) == TURN.format(observation=step_obs)
    # the user injection mode (manager :375-378): memory as a user message of its own
    user_cfg = PromptConfig(conversation="full", layout="official", experience_place="user")
    assert [m["content"] for m in build_messages(user_cfg, experience_text="Tip.", **kwargs)] == [
        SYSTEM, MEMORY.format(memory_message="Tip."), INSTRUCTION + "\n" + TURN.format(observation=obs)]
    env.close()


def test_official_layout_never_cuts_an_observation():
    env, obs, info = first_turn()
    cfg = PromptConfig(conversation="full", layout="official", max_observation_chars=100)
    long_obs = obs * 20
    [_, user] = build_messages(cfg, family="minihack", goal="", observation=long_obs, history=[],
                               admissible_actions=None, official=info["official_prompt"])
    assert long_obs in user["content"] and "characters cut" not in user["content"]
    env.close()


def test_memory_in_the_system_message_under_our_layout():
    """experience_place=system without official pieces: the family's own system prompt, then the
    memory header; the user message has no experience block."""
    cfg = PromptConfig(experience_place="system")
    system, user = build_messages(cfg, family="minihack", goal="Reach the stairs.",
                                  observation="You see: stairs", history=[],
                                  admissible_actions=["north"], experience_text="Tip one.")
    assert system["content"] == (PromptConfig().system_prompt("minihack") + "\n"
                                 + "\nBelow is distilled knowledge from earlier experiences.\n"
                                   "Use it to guide your actions without overfitting.\nSome "
                                   "insights may be overly specific, so identify only what is "
                                   "most relevant.\nKnowledge: \nTip one.\n")
    assert "Tip one." not in user["content"] and "Experience from" not in user["content"]
    ours = build_messages(PromptConfig(), family="minihack", goal="Reach the stairs.",
                          observation="You see: stairs", history=[], admissible_actions=["north"],
                          experience_text="Tip one.")
    assert ours[0]["content"] == PromptConfig().system_prompt("minihack")
    assert "Tip one." in ours[1]["content"]


def test_gate_task_prompt_is_the_official_actor_critic_one():
    """mixin :576-592 + :539-545: "Environment Instruction: " + system template, "\\n",
    "Observation: " + instruction + turn template around the tool-text first observation (no
    newline between the instruction and the template, unlike the actor's message)."""
    env, obs, info = first_turn(3)
    tool = TOOL + "x\n"
    assert official_task_prompt(info["official_prompt"], obs + tool) == (
        "Environment Instruction: " + SYSTEM + "\nObservation: " + INSTRUCTION
        + TURN.format(observation=obs + tool))
    env.close()


def test_official_layout_needs_full_conversations():
    with pytest.raises(ValueError, match="conversation='full'"):
        PromptConfig(layout="official")
    with pytest.raises(ConfigError, match="rollout.conversation=full"):
        build_config(agent="grpo", tasks="minihack", preset="tiny",
                     overrides={"rollout.prompt_layout": "official"})


def test_paper_sets_the_official_view_and_layout_and_the_cpu_presets_do_not():
    paper = PRESETS["paper"]()
    # multitask_env_tool.yaml:275-279: the launched env's keys (the official view) and no step
    # penalty
    assert paper.rollout.env_kwargs["minihack"] == {"view": "official", "penalty_step": 0.0}
    assert (paper.rollout.prompt_layout, paper.rollout.experience_place) == ("official", "system")
    assert paper.rollout.conversation == "full"
    for name in ("tiny", "quick", "cpu"):
        cfg = PRESETS[name]()
        assert "minihack" not in cfg.rollout.env_kwargs
        assert (cfg.rollout.prompt_layout, cfg.rollout.experience_place) == ("ours", "user")


# --- end to end: the engine's prompts and the runner's gate prompt -------------------------------
def test_engine_prompts_are_the_official_conversation():
    """The rollout engine on the real env (view="official") under the official layout: turn 1's
    prompt is what the chat template renders for (system + memory, instruction + turn template
    around the first observation); turn 2's adds the completion and the turn template around the
    observation that came back (manager :358-406), token for token."""
    torch = pytest.importorskip("torch")
    from crl_bench.llm.hf_backend import HFBackend
    from crl_bench.llm.rollout import EpisodeSpec, RolloutEngine
    from crl_bench.llm.types import SamplingParams
    from _forced_backend import ForcedBackend

    torch.set_num_threads(1)
    backend = ForcedBackend(HFBackend("tiny-sft", roles=("actor",), lora=None, seed=0,
                                      dtype="float32", device="cpu"),
                            lambda prompt: "<think>east looks open</think><answer>east</answer>")
    cfg = PromptConfig(conversation="full", layout="official", experience_place="system",
                       max_turns=2)
    engine = RolloutEngine(backend, SamplingParams(max_new_tokens=24, seed=0), cfg)
    env, obs, info = first_turn(1)
    spec = EpisodeSpec(env=env, seed=1, with_experience=True, experience_text="Walk east.")
    [traj] = engine.run([spec])
    assert len(traj.turns) == 2 and traj.turns[0].action == "east"
    tok = backend.tokenizer
    messages = [{"role": "system", "content": SYSTEM + "\n" + MEMORY.format(memory_message="Walk east.")},
                {"role": "user", "content": INSTRUCTION + "\n" + TURN.format(observation=obs)}]
    render = lambda m: tok.apply_chat_template(m, add_generation_prompt=True, tokenize=False)  # noqa: E731
    assert tok.decode(traj.turns[0].prompt_ids) == render(messages)
    assert traj.turns[0].observation.endswith(ACTIONS)
    messages += [{"role": "assistant", "content": traj.turns[0].completion_text},
                 {"role": "user", "content": TURN.format(observation=traj.turns[0].observation)}]
    assert tok.decode(traj.turns[1].prompt_ids) == render(messages)
    env.close()


@pytest.mark.parametrize("search_ask", [True, False])
def test_runner_gate_prompt_under_paper(tmp_path, search_ask):
    """The player's gate prompt under ``paper``: the official actor-critic's initial task prompt
    (mixin :576-592), with the tool text when Search-and-Ask is on (tool_env_wrapper.py:23-28);
    under the CPU presets ``Goal: ...\\nObservation: ...``."""
    from crl_bench.run.context import RunContext
    from crl_bench.records.files import RunDir

    cpu = {"model.device": "cpu", "model.backend": "hf", "model.dtype": "float32"}
    cfg = build_config(agent="comp_rl", tasks="minihack", preset="paper", overrides=cpu)
    ctx = RunContext(cfg, RunDir(tmp_path / "paper"))
    ctx.experience.search_ask = search_ask
    env, obs, info = first_turn(2)
    x = cfg.experience  # the run's ask tag and budget
    tool = TOOL + ASK_INSTRUCTION.format(q=x.ask_tag, n=x.max_asks) + "\n" if search_ask else ""
    assert ctx.player.task_prompt(info["goal"], obs, info["official_prompt"]) == (
        "Environment Instruction: " + SYSTEM + "\nObservation: " + INSTRUCTION
        + TURN.format(observation=obs + tool))
    tiny = RunContext(build_config(agent="comp_rl", tasks="minihack", preset="tiny"),
                      RunDir(tmp_path / "tiny"))
    assert tiny.player.task_prompt(info["goal"], obs, None) == f"Goal: {info['goal']}\nObservation: {obs}"
    env.close()


def test_paper_step_penalty_is_the_launched_zero():
    """yaml :279 ``penalty_step: 0.0``: walking into the wall costs nothing under ``paper``; NLE's
    default (our CPU presets) is -0.01 for a move that does not advance the game clock."""
    kwargs = PRESETS["paper"]().rollout.env_kwargs["minihack"]
    for make_kwargs, expected in (({}, -0.01), (kwargs, 0.0)):
        env = gymnasium.make("crl/MiniHack-Room-5x5-v0", **make_kwargs)
        env.reset(seed=0)
        rewards = {env.step("north")[1] for _ in range(6)}  # the top wall is reached by then
        assert expected in rewards and rewards <= {0.0, expected}
        env.close()


def test_fidelity_doc_shows_the_generated_observations():
    """docs/fidelity.md's side-by-side section is the script's output from the real env now."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "scripts" / "minihack_official_view.py"
    spec = importlib.util.spec_from_file_location("minihack_official_view", path)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    doc = script.DOC.read_text()
    assert script.current(doc) == script.section(), \
        "regenerate it: python scripts/minihack_official_view.py --write"
    row = next(line for line in doc.splitlines() if line.startswith("| 5b |"))
    assert "tests/test_minihack_official_view.py" in row and "`paper`: the same" in row
