"""The ``tiny-sft`` test model: ``tiny-random`` taught the answer formats the prompts ask for.

Its training data is fabricated here from the real prompt builders (MiniHack observations for
the actor, extraction / merge / Search-and-Ask prompts for the extractor, bank entries), so this
module sits above the actor's and the extractor's prompting code. ``crl_bench.llm.models`` lists
the model (``KNOWN_MODELS["tiny-sft"]``) and calls :func:`build_tiny_sft` to build it once into
the cache. One thread, fixed seeds: the same weights every time on one machine kind.
"""

from __future__ import annotations

import json
from pathlib import Path

from crl_bench.llm.models import TINY_SFT_SEED, TINY_SFT_STEPS, _build_tiny_random

TINY_SFT_LR = 5e-3


_DIRS = ("north", "northeast", "east", "southeast", "south", "southwest", "west", "northwest")
_DISTANCES = ("adjacent", "very near", "near", "far")
_MONSTERS = ("jackal", "newt", "grid bug", "sewer rat", "kobold")
_MESSAGES = ("", "Hello Agent, welcome to NetHack!  You are a chaotic male human Rogue.",
             "It's solid stone.", "You hear some noises in the distance.", "You see here a dart.")
_QUERIES = ("how do I find the stairs?", "where is the staircase down?",
            "what should I do in a dark room?", "how do I get past the monster?")
_ASK_QUERY = "advice please: how do I reach the stairs?"
_TIPS = (("Head for the stairs", "When the staircase down is listed, step in its direction every turn."),
         ("Explore dark rooms", "If nothing is in sight, move along an open direction you have not tried."),
         ("Avoid the monster", "Step away from an adjacent monster and keep moving towards the goal."),
         ("Mind the trap", "Do not step onto a square listed as a trap; go around it."),
         ("Keep moving", "Do not repeat a move that changed nothing; pick another open direction."))
_ADVICE = ("Move towards the staircase down as soon as you see it.",
           "Try an open direction you have not used yet.",
           "Keep away from the monster and head for the stairs.")
_OTHER_FAMILIES = {
    "alfworld": ("Put a clean mug in the coffee machine.",
                 ("go to countertop 1", "go to cabinet 2", "open drawer 1", "take mug 1 from countertop 1",
                  "clean mug 1 with sinkbasin 1", "examine shelf 3", "inventory", "look")),
    "webshop": ("i need a pair of blue running shoes under 50 dollars",
                ("search[blue running shoes]", "click[back to search]", "click[next >]",
                 "click[buy now]", "click[size 9]", "click[b07xyz1234]", "click[description]")),
}


def _mh_observation(rng) -> tuple[str, str | None, list[str]]:
    """A MiniHack language observation (the format of crl_bench.envs.minihack.language):
    (text, direction of the stairs or None, open directions)."""
    feats, stairs = [], None
    if rng.random() < 0.45:
        stairs = rng.choice(_DIRS)
        feats.append(f"- staircase down: {rng.choice(_DISTANCES)} {stairs}")
    if rng.random() < 0.3:
        feats.append(f"- {rng.choice(_MONSTERS)} (monster): {rng.choice(_DISTANCES)} {rng.choice(_DIRS)}")
    if rng.random() < 0.5:
        walls = rng.sample(_DIRS, rng.randint(1, 3))
        feats.append("- wall: " + ", ".join(f"{rng.choice(_DISTANCES)} {d}" for d in walls))
    opens = rng.sample(_DIRS, rng.randint(1, 5))
    lines = (["You see:", *feats] if feats else ["You see nothing of note nearby."])
    lines.append("Open directions: " + ", ".join(f"{d} {rng.randint(1, 4)}" for d in opens) + ".")
    hp = rng.randint(8, 14)
    lines.append(f"Health: {hp} of 14 HP.")
    message = rng.choice(_MESSAGES)
    if message:
        lines.append(f"Message: {message}")
    return "\n".join(lines), stairs, opens


def _entry(rng, i: int):
    from crl_bench.experience.bank import ExperienceEntry

    title, content = rng.choice(_TIPS)
    return ExperienceEntry(id=i, title=title, content=content, family="minihack", task_ids=[],
                           run="", created_step=0, updated_step=0, source_trajectories=[],
                           times_retrieved=rng.randint(0, 3), last_retrieved=None, times_trained=0,
                           n_used=0, mean_outcome=None)


def _sft_actor_example(rng) -> tuple[list[dict], str]:
    from crl_bench.llm.prompting import HistoryItem, PromptConfig, build_messages

    asks_left = rng.choice((0, 1))
    config = PromptConfig(history=1, think=False)
    if rng.random() < 0.15:  # another family: answer one of the listed actions
        family = rng.choice(sorted(_OTHER_FAMILIES))
        goal, actions = _OTHER_FAMILIES[family]
        admissible = rng.sample(actions, rng.randint(2, len(actions)))
        messages = build_messages(config, family=family, goal=goal, observation="You are in the middle of a room.",
                                  history=[], admissible_actions=admissible, asks_left=asks_left)
        return messages, f"<answer>{rng.choice(admissible)}</answer>"
    observation, stairs, opens = _mh_observation(rng)
    roll = rng.random()
    if roll < 0.15:
        observation = f"Invalid format (no answer block found); the environment did not change.\n\n{observation}"
    elif roll < 0.25:
        observation = (f"Advice for your question \"{rng.choice(_QUERIES)}\":\n{rng.choice(_ADVICE)}\n\n"
                       f"{observation}")
    history = []
    turn = rng.randint(0, 3)
    if turn:
        history = [HistoryItem(_mh_observation(rng)[0], rng.choice(_DIRS + ("(invalid format)",)))]
    experience = ""
    if rng.random() < 0.4:
        experience = "\n".join(_entry(rng, i).render() for i in range(rng.randint(1, 2)))
    messages = build_messages(
        config, family="minihack",
        goal="Reach the staircase down (>) in this room. The room is dark: you only see the squares next to "
             "you, so explore to find the stairs.",
        observation=observation, history=history, admissible_actions=list(_DIRS),
        experience_text=experience, asks_left=asks_left, turn_index=turn)
    if asks_left and rng.random() < 0.2:
        # one fixed question: a 2-layer model cannot track which tag it opened, but it learns
        # that these words only ever follow <ask> and end with </ask>
        return messages, f"<ask>{_ASK_QUERY}</ask>"
    if rng.random() < 0.05:  # off-format answers, so that sampled outcomes vary
        return messages, rng.choice(("north", "<answer>go east", "<answer></answer>", "I move west."))
    # a 2-layer model does not learn to copy the direction in a few hundred steps; what it learns
    # is the format and a spread over the moves (a random walk: some episodes reach the stairs)
    action = stairs if stairs and rng.random() < 0.85 else rng.choice(_DIRS)
    return messages, f"<answer>{action}</answer>"


def _sft_extractor_example(rng) -> tuple[list[dict], str]:
    from crl_bench.extractor.extraction import build_extraction_messages, trajectory_to_text
    from crl_bench.extractor.merge import build_merge_messages
    from crl_bench.extractor.search_ask import EpisodeContext, build_search_ask_messages

    roll = rng.random()
    goal = "Reach the staircase down (>) in this room."
    if roll < 0.15:  # Search-and-Ask: advice in the answer block
        entries = [_entry(rng, rng.randint(1, 40))]
        messages = build_search_ask_messages(rng.choice(_QUERIES), EpisodeContext(goal, _mh_observation(rng)[0]),
                                             entries)
        return messages, f"<answer>{rng.choice(_ADVICE)}</answer>"
    if roll < 0.25:  # merge: fold the first two entries of the window into one
        ids = sorted(rng.sample(range(1, 60), rng.randint(2, 4)))
        entries = [_entry(rng, i) for i in ids]
        title, content = rng.choice(_TIPS)
        item = {"op": "merge", "ids": ids[:2], "title": title, "content": content}
        return build_merge_messages(entries, "minihack"), f"<answer>{json.dumps([item])}</answer>"
    pairs = []
    for _ in range(rng.randint(1, 4)):
        obs, stairs, opens = _mh_observation(rng)
        pairs.append((obs, rng.choice(opens)))
    success = rng.random() < 0.4
    retrieved = [_entry(rng, rng.randint(1, 40))] if rng.random() < 0.5 else []
    messages = build_extraction_messages(
        goal, trajectory_to_text(pairs, max_chars=3000),
        {"success": success, "score": float(success), "n_actions": len(pairs)}, retrieved)
    title, content = rng.choice(_TIPS)
    item = {"op": "add", "title": title, "content": content}
    answer = f"<answer>{json.dumps([item])}</answer>"
    if rng.random() < 0.1:  # broken answers, so that malformed outputs (credit -1) occur
        answer = answer[: rng.randint(10, len(answer) - 12)]
    return messages, answer


def build_tiny_sft(out: Path) -> None:
    """``tiny-random`` after TINY_SFT_STEPS supervised steps on answers in the formats the prompts
    ask for (see KNOWN_MODELS["tiny-sft"]). One thread, fixed seeds: the same weights every time."""
    import random

    import torch

    from transformers import AutoModelForCausalLM, AutoTokenizer

    _build_tiny_random(out)
    tokenizer = AutoTokenizer.from_pretrained(str(out))

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(TINY_SFT_SEED)
            model = AutoModelForCausalLM.from_pretrained(str(out), dtype=torch.float32)
            rng = random.Random(TINY_SFT_SEED)
            examples = []
            for i in range(TINY_SFT_STEPS * 8):
                messages, answer = (_sft_actor_example if i % 2 == 0 else _sft_extractor_example)(rng)
                prompt = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
                if hasattr(prompt, "keys"):
                    prompt = prompt["input_ids"]
                completion = tokenizer(answer, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
                examples.append((list(prompt), completion))
            optimizer = torch.optim.AdamW(model.parameters(), lr=TINY_SFT_LR, weight_decay=0.0)
            model.train()
            for step in range(TINY_SFT_STEPS):
                batch = examples[step * 8:(step + 1) * 8]
                width = max(len(p) + len(c) for p, c in batch)
                ids = torch.full((len(batch), width), tokenizer.pad_token_id, dtype=torch.long)
                labels = torch.full((len(batch), width), -100, dtype=torch.long)
                mask = torch.zeros((len(batch), width), dtype=torch.long)
                for row, (p, c) in enumerate(batch):
                    seq = p + c
                    ids[row, :len(seq)] = torch.tensor(seq)
                    labels[row, len(p):len(seq)] = torch.tensor(c)
                    mask[row, :len(seq)] = 1
                hidden = model.model(input_ids=ids, attention_mask=mask).last_hidden_state
                pos = labels[:, 1:] != -100
                logits = model.lm_head(hidden[:, :-1][pos])
                loss = torch.nn.functional.cross_entropy(logits, labels[:, 1:][pos])
                optimizer.zero_grad()
                loss.backward()
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                optimizer.step()
            model.eval()
    finally:
        torch.set_num_threads(threads)
    model.save_pretrained(str(out), safe_serialization=True)
