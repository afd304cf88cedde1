"""The plan's analysis (experiments/experience_records.py) on hand-written compact records: the
per-run figures, collapsed seeds, missing runs and the verdict follow PLAN.md's definitions."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "experiments"))

import experience_records as er  # noqa: E402
import minihack_landmark  # noqa: E402

LEVELS = 8
EVAL_STEPS = (0, 5, 10, 15, 20)


def write_run(records: Path, agent: str, seed: int, solved: dict[tuple[int, int], int],
              last_actions: dict[str, int], state: str = "done") -> None:
    """``solved[(step, exp)]`` of the ``LEVELS`` evaluation levels solved at that step."""
    header = {"agent": agent, "run_seed": seed, "tasks": "t", "preset": "cpu", "steps": 20,
              "state": state, "last_step": max(s for s, _ in solved), "eval": {},
              "train_levels": list(range(seed * 100, seed * 100 + 16)),
              "train_actions": {"20": last_actions}}
    lines = [{"run": header}]
    for (step, exp), k in sorted(solved.items()):
        lines += [{"step": step, "seed": 1_000_000 + i, "task": "t", "exp": exp,
                   "actions": ["north"], "success": int(i < k), "score": float(i < k)}
                  for i in range(LEVELS)]
    records.mkdir(parents=True, exist_ok=True)
    (records / f"{agent}__seed{seed}.jsonl").write_text("\n".join(json.dumps(x) for x in lines) + "\n")


SPREAD = {"north": 5, "south": 3}  # top move 5/8
COLLAPSED = {"north": 19, "south": 1}  # top move 95%


def test_analysis_figures_collapse_missing_and_verdict(tmp_path) -> None:
    records = tmp_path / "records"
    for seed in range(5):
        # grpo: 1/8 throughout; seed 4 sends one move 95% of the time: collapsed (end 1/8 <= .175)
        write_run(records, "grpo", seed, {(s, 0): 1 for s in EVAL_STEPS},
                  COLLAPSED if seed == 4 else SPREAD)
        if seed == 3:
            continue  # comp_rl seed 3 never ran: missing
        # comp_rl with experience: 1/8 at step 0, then 4/8 (+ seed / 8 at the end)
        solved = {(s, 1): (1 if s == 0 else 4) for s in EVAL_STEPS}
        solved[(20, 1)] = 4 + seed
        solved.update({(s, 0): 1 for s in EVAL_STEPS})
        write_run(records, "comp_rl", seed, solved, SPREAD)
    # exp_only seed 0 stopped after step 10: its curve has no end, listed as missing
    write_run(records, "exp_only", 0, {(s, e): 1 for s in (0, 5, 10) for e in (0, 1)}, SPREAD,
              state="running")
    result = er.analyse(records)
    missing = {(m["agent"], m["seed"], m.get("series")) for m in result["missing"]}
    assert ("comp_rl", 3, None) in missing
    assert {("exp_only", 0, "exp_only with exp"), ("exp_only", 0, "exp_only without exp")} <= missing
    assert {(a, s) for a, s, _ in missing} == {("comp_rl", 3)} | {("exp_only", s) for s in range(5)}
    rows = {(r["series"], r["seed"]): r for r in result["runs"]}
    c0 = rows[("comp_rl with exp", 0)]
    # curve 1/8, 4/8, 4/8, 4/8, 4/8: (5 * (1/8 + 4/8) / 2 + 3 * 5 * 4/8) / 20
    assert (c0["start"], c0["end"]) == (1 / 8, 4 / 8)
    assert c0["auc"] == pytest.approx((5 * (1 / 8 + 4 / 8) / 2 + 15 * 4 / 8) / 20)
    assert [s for (name, s), r in rows.items() if r["collapsed"]] == [4]
    assert rows[("grpo", 4)]["top_move_share"] == pytest.approx(0.95)
    primary = result["comparisons"][0]
    assert (primary["n_a"], primary["n_b"], primary["perm_assignments"]) == (4, 5, 126)
    assert primary["perm_p_greater"] == pytest.approx(1 / 126)  # every comp_rl AUC above grpo's
    assert primary["paired_seeds"] == [0, 1, 2, 4] and primary["sign_test_p_greater"] == 1 / 16
    assert primary["low"] > 0 and result["verdict"] == "hit"
    assert not result["held_out_violations"]


def test_training_on_an_evaluation_level_is_reported(tmp_path) -> None:
    records = tmp_path / "records"
    write_run(records, "grpo", 0, {(s, 0): 1 for s in EVAL_STEPS}, SPREAD)
    path = records / "grpo__seed0.jsonl"
    lines = path.read_text().splitlines()
    header = json.loads(lines[0])
    header["run"]["train_levels"].append(1_000_003)
    path.write_text("\n".join([json.dumps(header)] + lines[1:]) + "\n")
    result = er.analyse(records, agents=("grpo",), seeds=(0,))
    assert result["held_out_violations"] == {"grpo seed 0": [1_000_003]}
    assert "VIOLATED" in er.summary_markdown(result)


def test_the_command_reads_the_records_and_writes_the_tables_and_plot(tmp_path, capsys) -> None:
    records = tmp_path / "records"
    for seed in range(2):
        write_run(records, "grpo", seed, {(s, 0): seed + 1 for s in EVAL_STEPS}, SPREAD)
    out = tmp_path / "out"
    assert minihack_landmark.main(["analyse", "--summary-only", "--records", str(records),
                                   "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "comp_rl seed 0: no records file" in text and "| grpo | 2 |" in text
    assert json.loads((out / "analysis.json").read_text())["verdict"] == "no data"
    pytest.importorskip("matplotlib")
    assert (out / "curves.png").stat().st_size > 0


def test_a_verdict_on_part_of_the_planned_runs_is_called_provisional(tmp_path) -> None:
    records = tmp_path / "records"
    for agent in ("grpo", "comp_rl"):
        write_run(records, agent, 0, {(s, e): 1 for s in EVAL_STEPS for e in (0, 1)}, SPREAD)
    text = er.summary_markdown(er.analyse(records))
    assert "Provisional verdict (PLAN.md rule on the 2 of 15 planned runs recorded so far)" in text
    assert "**Verdict" not in text
    # a plan ended before all its runs says so, with its reason, and claims no verdict
    (records / er.ENDED_EARLY).write_text("the bank was broken.\n")
    text = er.summary_markdown(er.analyse(records))
    assert "The plan was ended after 2 of its 15 planned runs: the bank was broken." in text
    assert "Provisional" not in text and "**Verdict" not in text


def test_bank_content_judges_entries_against_the_level_rule(tmp_path):
    """Levels 8 and 16 are fountain rooms (stairs southwest) at two ring squares, level 9 an altar
    room (north) (``landmark_layout``); each key holds what the ``action`` template writes, or
    other text. Two starts of one kind hold a right success: two keys, one kind."""
    np = pytest.importorskip("numpy")
    from crl_bench.envs.minihack.landmark import landmark_layout
    from crl_bench.experience.bank import ExperienceBank

    assert [landmark_layout(s)[::2] for s in (8, 16, 9)] == [
        ("fountain", "southwest"), ("fountain", "southwest"), ("altar", "north")]
    bank = ExperienceBank(tmp_path / "bank.sqlite", dim=4, embedder_name="test")
    a, b, c = np.eye(4, dtype=np.float32)[:3]
    rows = [("To succeed, take the action southwest.", "8", a),
            ("To avoid this failure, do not take the action north.", "8", a),
            ("To succeed, take the action east.", "9", b),
            ("When you see an altar, go north.", "9", b),
            ("To succeed, take the action southwest.", "16", c)]
    bank.add([{"title": "t", "content": content, "family": "minihack", "task_ids": [level]}
              for content, level, _ in rows], np.stack([v for _, _, v in rows]), step=1)
    bank.close()
    got = er.bank_content(tmp_path / "bank.sqlite")
    assert got == {"entries": 5, "keys": 3, "keys_with_a_success_naming_the_rule": 2,
                   "kinds_with_a_success_naming_the_rule": 1, "merged": 0,
                   "success": 3, "success_naming_the_rule": 2, "failure": 1,
                   "failure_naming_another_move": 1, "other_text": 1,
                   "levels_of_several_kinds": 0}
    assert er.entry_claim("To avoid this failure, do not take the action far east.") == \
        ("failure", "far east")
    assert er.entry_claim("take the action east") is None


def test_train_hints_count_what_was_shown_and_done(tmp_path):
    """Level 8 is a fountain room (stairs southwest), level 9 an altar room (north)."""
    import gzip

    def traj(seed, text, action, success, with_exp=True):
        return {"seed": seed, "with_experience": with_exp, "experience_text": text,
                "success": success, "turns": [{"kind": "action", "action": action}]}

    rows = [traj(8, "Reach the stairs: what worked: To succeed, take the action southwest.",
                 "southwest", True),
            traj(9, "t: what went wrong: To avoid this failure, do not take the action north.",
                 "east", False),
            traj(9, "", "north", True),
            traj(8, "To succeed, take the action east.", "east", False, with_exp=False)]
    (tmp_path / "trajectories").mkdir()
    with gzip.open(tmp_path / "trajectories" / "train_step_00003.jsonl.gz", "wt") as fh:
        fh.write("\n".join(json.dumps(r) for r in rows) + "\n")
    actions, hints, _ = er.train_step_stats(tmp_path)
    assert actions == {3: {"east": 2, "north": 1, "southwest": 1}}
    assert hints == {3: {
        "with_exp": 3, "shown": 2, "success_hint": 1, "success_hint_rule": 1, "followed": 1,
        "followed_solved": 1, "failure_hint": 1, "failure_hint_rule": 0, "avoided": 1}}
    assert er.text_claim("x: To avoid this failure, do not take the action far east.\nmore") == \
        ("failure", "far east")


def test_train_examples_count_the_format_example_against_the_claim(tmp_path):
    """The example move is read back from the real prompt ids (the runner's prompt builder, the
    embedded model's tokenizer): an episode that sends it is counted, and one shown a success
    claim naming another move counts whether it sent the claim's move or the example's."""
    import gzip

    from crl_bench.llm.models import load_tokenizer
    from crl_bench.llm.prompting import PromptConfig, build_messages, example_action

    tok = load_tokenizer("smollm2-135m")
    config = PromptConfig(answer_example=True, example_pick="random", think=False)
    moves = ["north", "northeast", "east", "southeast", "south", "southwest", "west", "northwest"]

    def prompt(seed: int) -> tuple[list[int], str]:
        msgs = build_messages(config, family="minihack", goal="Reach the stairs.",
                              observation="You see: rock", history=[], admissible_actions=moves,
                              example_seed=seed)
        text = tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
        return tok.encode(text, add_special_tokens=False), example_action(config, moves, seed, 0)

    (ids0, ex0), (ids1, ex1), (ids2, ex2) = prompt(0), prompt(1), prompt(2)
    claim = next(m for m in moves if m != ex1)
    rows = [  # example followed; claim followed over the example; example over the claim;
        # an invalid answer; an episode without prompt ids (not counted)
        {"seed": 8, "with_experience": False, "experience_text": "", "success": False,
         "turns": [{"kind": "action", "action": ex0, "prompt_ids": ids0}]},
        {"seed": 8, "with_experience": True, "success": False,
         "experience_text": f"t: what worked: To succeed, take the action {claim}.",
         "turns": [{"kind": "action", "action": claim, "prompt_ids": ids1}]},
        {"seed": 8, "with_experience": True, "success": False,
         "experience_text": f"t: what worked: To succeed, take the action {claim}.",
         "turns": [{"kind": "action", "action": ex1, "prompt_ids": ids1}]},
        {"seed": 8, "with_experience": False, "experience_text": "", "success": False,
         "turns": [{"kind": "invalid", "action": None, "prompt_ids": ids2}]},
        {"seed": 8, "with_experience": False, "experience_text": "", "success": False,
         "turns": [{"kind": "action", "action": "north"}]},
    ]
    (tmp_path / "trajectories").mkdir()
    with gzip.open(tmp_path / "trajectories" / "train_step_00002.jsonl.gz", "wt") as fh:
        fh.write("\n".join(json.dumps(r) for r in rows) + "\n")
    assert er.format_example(tok.decode(ids1)) == ex1
    _, _, examples = er.train_step_stats(tmp_path, tok.decode)
    assert examples == {2: {"episodes": 4, "moved": 3, "sent_example": 2, "claim_not_example": 2,
                            "sent_claim": 1, "sent_example_not_claim": 1}}
    assert er.train_step_stats(tmp_path)[2] == {}  # no tokenizer: nothing read
