"""Write the "MiniHack observation and prompt, official and ours" section of docs/fidelity.md
from the real env (nothing in it is typed by hand).

    python scripts/minihack_official_view.py           # print the section
    python scripts/minihack_official_view.py --write   # replace it in docs/fidelity.md

The level is the launched task (``MiniHack-Room-Ultimate-5x5-v0``, level seed 0), played with
the same actions under both views; the messages are what the prompt builder makes of the first
observation under ``paper`` (``rollout.prompt_layout=official``,
``rollout.experience_place=system``, ``view="official"``), with one retrieved entry and without
the Search-and-Ask tool text (a long instruction, the same under every layout); ours is the
language view's text and the family's system prompt. tests/test_minihack_official_view.py checks that the doc holds
exactly this output.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "fidelity.md"
BEGIN = "<!-- minihack-official-view: begin (scripts/minihack_official_view.py --write) -->"
END = "<!-- minihack-official-view: end -->"
ENV_ID = "crl/MiniHack-Room-Ultimate-5x5-v0"
SEED = 0
ACTIONS = ("east", "south")
ENTRY = "Walk toward the > you see; in the dark, step along a wall."


def _block(text: str) -> str:
    return "````text\n" + text.rstrip("\n") + "\n````"


def _messages(view: str, preset: str) -> tuple[list[dict[str, str]], list[str], str]:
    import gymnasium

    import crl_bench  # noqa: F401  (registers the crl/ envs)
    from crl_bench.llm.prompting import PromptConfig, build_messages
    from crl_bench.config.schema import PRESETS

    cfg = PRESETS[preset]()
    r = cfg.rollout
    prompt = PromptConfig(history=r.history, think=r.think, conversation=r.conversation,
                          layout=r.prompt_layout, experience_place=r.experience_place)
    env = gymnasium.make(ENV_ID, view=view)
    obs, info = env.reset(seed=SEED)
    messages = build_messages(prompt, family="minihack", goal=info["goal"], observation=obs,
                              history=[], admissible_actions=info["admissible_actions"],
                              experience_text=ENTRY, official=info.get("official_prompt"))
    later = []
    for action in ACTIONS:
        later.append(env.step(action)[0])
    env.close()
    return messages, later, obs


def section() -> str:
    official, official_later, _ = _messages("official", "paper")
    ours, ours_later, ours_first = _messages("full", "cpu")
    out = [BEGIN, "",
           f"Generated from the real env by `python scripts/minihack_official_view.py --write`: "
           f"`{ENV_ID}` (the launched task), level seed {SEED}, the first turn's messages with "
           f"one retrieved entry (`{ENTRY}`) and no Search-and-Ask tool text, then the "
           f"observations after `{ACTIONS[0]}` and `{ACTIONS[1]}`.", "",
           "**Official** (`--preset paper`: `view=\"official\"`, `rollout.prompt_layout=official`, "
           "`rollout.experience_place=system`). System message:", "", _block(official[0]["content"]),
           "", "First user message:", "", _block(official[-1]["content"]), ""]
    for action, obs in zip(ACTIONS, official_later):
        out += [f"Observation after `{action}` (the next user message is the turn template "
                "around it):", "", _block(obs), ""]
    out += ["**Ours** (`tiny`, `quick`, `cpu`: the language view, our layout). System message "
            "(the family's registered prompt; our user message holds the goal, the experience "
            "block, the observation, the admissible actions and the answer format, "
            "`crl_bench/llm/prompting.py` `build_messages`):", "", _block(ours[0]["content"]), "",
            "First observation:", "", _block(ours_first), ""]
    for action, obs in zip(ACTIONS, ours_later):
        out += [f"Observation after `{action}`:", "", _block(obs), ""]
    out.append(END)
    return "\n".join(out)


def replace_in(doc: str, new: str) -> str:
    if BEGIN not in doc or END not in doc:
        raise SystemExit(f"{DOC} has no section markers ({BEGIN} ... {END}); add them first.")
    head, rest = doc.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    return head + new + tail


def current(doc: str) -> str:
    """The section as the doc holds it now (markers included)."""
    return BEGIN + doc.split(BEGIN, 1)[1].split(END, 1)[0] + END


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--write", action="store_true", help="replace the section in the doc")
    args = parser.parse_args(argv)
    text = section()
    if args.write:
        DOC.write_text(replace_in(DOC.read_text(), text))
        print(f"wrote {DOC.relative_to(ROOT)}")
    else:
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
