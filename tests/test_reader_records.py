"""The comparison's exported evaluation records say what each held-out episode was shown (the
format line's example, read back from its real prompt ids, and the entry's claim), and the
analysis reports per series the share of answers equal to the example shown."""

from __future__ import annotations

import gzip
import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "experiments"))
import experience_records as er  # noqa: E402

MOVES = ["north", "northeast", "east", "southeast", "south", "southwest", "west", "northwest"]


def test_eval_shown_reads_the_example_and_the_claim(tmp_path):
    pytest.importorskip("transformers")
    from crl_bench.llm.models import load_tokenizer
    from crl_bench.llm.prompting import PromptConfig, build_messages, example_action

    tok = load_tokenizer("smollm2-135m")

    def ids(pick: str, seed: int) -> list[int]:
        msgs = build_messages(PromptConfig.for_small_model(example_pick=pick), family="minihack",
                              goal="g", observation="o", history=[], admissible_actions=MOVES,
                              example_seed=seed)
        text = tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
        return tok.encode(text, add_special_tokens=False)

    rnd = PromptConfig.for_small_model(example_pick="random")
    rows = [{"seed": 1_000_003, "with_experience": True,
             "experience_text": "t: what went wrong: To avoid this failure, do not take the action east.",
             "turns": [{"prompt_ids": ids("placeholder", 0)}]},
            {"seed": 1_000_003, "with_experience": False, "experience_text": "",
             "turns": [{"prompt_ids": ids("random", 4)}]},
            {"seed": 1_000_004, "with_experience": False, "experience_text": "", "turns": []}]
    (tmp_path / "trajectories").mkdir()
    with gzip.open(tmp_path / "trajectories" / "eval_step_00005.jsonl.gz", "wt") as fh:
        fh.write("\n".join(json.dumps(r) for r in rows) + "\n")
    shown = er.eval_shown(tmp_path, tok.decode)
    assert shown == {(5, 1_000_003, 1): {"example": "action", "claim": ["failure", "east"]},
                     (5, 1_000_003, 0): {"example": example_action(rnd, MOVES, 4, 0),
                                         "claim": None},
                     (5, 1_000_004, 0): {"example": None, "claim": None}}


def test_the_analysis_tables_answers_equal_to_the_example(tmp_path):
    header = {"agent": "grpo", "run_seed": 0, "state": "done", "last_step": 20,
              "train_levels": [5], "train_actions": {}}
    lines = [{"run": header}]
    for step in (0, 5, 10, 15, 20):
        lines += [{"step": step, "seed": 1_000_000 + i, "task": "t", "exp": 0,
                   "actions": [a], "success": int(i == 0), "score": 0.0, "example": ex}
                  for i, (a, ex) in enumerate([("north", "north"), ("East ", "action"),
                                               ("ACTION", "action"), ("west", None)])]
    (tmp_path / "grpo__seed0.jsonl").write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    result = er.analyse(tmp_path, agents=("grpo",), seeds=(0,), steps=20)
    assert result["eval_examples"] == [{"series": "grpo", "seed": 0, "episodes": 20, "shown": 15,
                                        "sent_example": 10, "examples": ["action", "north"]}]
    md = er.summary_markdown(result)
    assert "| grpo | 0 | 20 | 15 | 10/15 = 0.67 | action, north |" in md
    # records without the field (exported before it existed): no table, nothing invented
    for x in lines[1:]:
        x.pop("example")
    (tmp_path / "grpo__seed0.jsonl").write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    assert "eval_examples" not in er.analyse(tmp_path, agents=("grpo",), seeds=(0,), steps=20)
