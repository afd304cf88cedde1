"""Under ``paper`` an ask's answer comes back as a tool-role message, not a user turn.

Official (ComplementaryRL ab2574f, ``roll/pipeline/agentic/``): after a parsed tool call the
wrapper's observation is the tool's output (``tools/tool_env_wrapper.py:45-57``; the Search-and-
Ask tool's is ``Search results: ...``, ``tools/search_and_ask_tool.py:102``) and the env manager
appends it as ``{"role": "tool", "content": observation}`` instead of the user turn
(``env_manager/traj_env_manager.py:391-392``). ``paper`` plays "full" conversations with
``experience.ask_style=official``; the CPU presets (``ask_style=short``) keep the user turn.

A chat template that renders no tool message is refused when the rollout engine is built (the
rule of ``crl_bench.llm.rollout.tool_turn_template``), naming the fix.
"""

from __future__ import annotations

import copy

import pytest

pytest.importorskip("torch")
pytest.importorskip("nle")

from crl_bench.llm.prompting import resolved_ask_answer_role  # noqa: E402
from crl_bench.llm.rollout import (EpisodeSpec, PromptConfig, RolloutEngine,  # noqa: E402
                                   ToolRoleError, tool_turn_template)
from crl_bench.llm.types import SamplingParams  # noqa: E402
from crl_bench.config.schema import PRESETS  # noqa: E402

ANSWER = "Search results: go north\n"
END = "<|im_end|>\n"


@pytest.fixture(scope="module")
def tiny():
    from crl_bench.llm.hf_backend import HFBackend

    return HFBackend("tiny-random", roles=("actor",), seed=0)


def play(tiny, style: str, role: str = "auto") -> list[str]:
    import gymnasium

    import crl_bench  # noqa: F401
    from _forced_backend import ForcedBackend

    prompts: list[str] = []

    def policy(prompt: str) -> str:
        prompts.append(prompt)
        return "<ask>which rock?</ask>" if len(prompts) == 1 else "<answer>north</answer>"
    backend = ForcedBackend(tiny, policy)
    env = gymnasium.make("crl/MiniHack-Room-Landmark-5x5-v0", max_steps=3, view="compact")
    engine = RolloutEngine(backend, SamplingParams(max_new_tokens=16, seed=0),
                           PromptConfig(conversation="full", history=-1, max_asks=2,
                                        ask_style=style, ask_answer_role=role),
                           adapter="actor", ask_callback=lambda q, spec, ctx: ANSWER)
    engine.reuse_kv = False
    (traj,) = engine.run([EpisodeSpec(env=env, seed=3, options=None, group_id=0,
                                      task_name="landmark", with_experience=True,
                                      experience_ids=[], experience_text="", meta={})])
    env.close()
    assert traj.n_tool_calls == 1 and traj.n_actions >= 1
    return prompts


def test_paper_hands_the_ask_answer_on_as_a_tool_message(tiny):
    paper = PRESETS["paper"]()
    assert (paper.experience.ask_style, paper.rollout.conversation) == ("official", "full")
    prompts = play(tiny, "official")
    after_ask = prompts[1][len(prompts[0]):]  # what the ask's answer added to the conversation
    # the ask's completion, the assistant close, the tool message, the next assistant header
    assert after_ask.endswith(f"{END}<|im_start|>tool\n{ANSWER}{END}<|im_start|>assistant\n")
    assert "<|im_start|>user" not in after_ask


@pytest.mark.parametrize("preset", ["tiny", "cpu"])
def test_cpu_presets_keep_the_user_turn(tiny, preset):
    cfg = PRESETS[preset]()
    assert resolved_ask_answer_role(PromptConfig(conversation="full",
                                                 ask_style=cfg.experience.ask_style)) == "user"
    after_ask = (lambda p: p[1][len(p[0]):])(play(tiny, cfg.experience.ask_style))
    assert "<|im_start|>user" in after_ask and "<|im_start|>tool" not in after_ask


RAISES = ("{% for m in messages %}{% if m['role'] not in ['system', 'user', 'assistant'] %}"
          "{{ raise_exception('Conversation roles must be system, user or assistant') }}"
          "{% endif %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}"
          "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")
DROPS = ("{% for m in messages %}{% if m['role'] in ['system', 'user', 'assistant'] %}"
         "{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}{% endif %}"
         "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")


@pytest.mark.parametrize("template", [RAISES, DROPS], ids=["raises", "drops"])
def test_a_template_without_a_tool_role_is_refused_naming_the_fix(tiny, template):
    from _forced_backend import ForcedBackend

    assert tool_turn_template(tiny.tokenizer) == ("<|im_start|>tool\n",
                                                  f"{END}<|im_start|>assistant\n")
    backend = ForcedBackend(tiny, lambda p: "<answer>north</answer>")
    backend.tokenizer = copy.deepcopy(tiny.tokenizer)
    backend.tokenizer.chat_template = template
    prompt = PromptConfig(conversation="full", history=-1, max_asks=2, ask_style="official")
    with pytest.raises(ToolRoleError, match="ask_answer_role=user"):
        RolloutEngine(backend, SamplingParams(max_new_tokens=16), prompt,
                      ask_callback=lambda q, s, c: ANSWER)
    # the fix named works: the answer in the next user turn
    RolloutEngine(backend, SamplingParams(max_new_tokens=16),
                  PromptConfig(conversation="full", history=-1, max_asks=2,
                               ask_style="official", ask_answer_role="user"),
                  ask_callback=lambda q, s, c: ANSWER)
    with pytest.raises(ValueError, match="needs conversation='full'"):
        PromptConfig(ask_answer_role="tool")


def test_the_ask_answer_role_is_one_setting_away(tmp_path):
    """``experience.ask_answer_role`` reaches the actor's prompt: "user" keeps the answer in the
    next user turn under any preset; the default "auto" resolves per preset as above."""
    from tests.test_fidelity_launched import make_ctx

    ctx = make_ctx(tmp_path, **{"experience.ask_answer_role": "user"})
    try:
        assert ctx.player.prompt_config().ask_answer_role == "user"
    finally:
        ctx.close()
    ctx = make_ctx(tmp_path / "b")
    try:
        assert ctx.player.prompt_config().ask_answer_role == "auto"
    finally:
        ctx.close()
