"""The accept / refine / reject gate: the actor judges a retrieved entry before it acts.

Official behaviour (ComplementaryRL fork of ROLL at ab2574f,
``roll/pipeline/agentic/env_manager/memory_integration_mixin.py``):

* ``hook_on_episode_start`` (lines 95-118): after retrieval at episode start, if entries were
  found and ``enable_actor_critic`` (``memory_config.py:190``, default True), the *actor* model
  is asked (``actor_critic``, lines 559-653) with ``ACTOR_CRITIC_SYS_PROMPT_251113`` /
  ``ACTOR_CRITIC_USER_PROMPT_251113`` (``examples/singletask-agentic/memory_prompts.yaml``
  lines 921-1033): the initial task prompt, the knowledge, and the historical average score on
  this task with its trajectory count.
* ``_parse_actor_critic_response`` (lines 680-740): the last ``<answer>`` JSON
  ``{"function_name": ..., "parameters": {...}}``: ``reject`` -> no knowledge shown, critic -1;
  ``accept`` -> the knowledge as is, critic 1; ``refine`` with a non-empty
  ``refined_knowledge`` -> the refined text shown, critic 0.5; anything else -> None: the
  knowledge is dropped and the episode credits nothing (``memory_uids = []``, line 111).
* ``add_memory_metadata`` (lines 385-400): the score that credits the extractor call behind the
  entry is ``critic`` when ``critic < 1`` else ``episode_score + critic``; then
  ``multi_agentic_pipeline.py:794-798`` maps a score of exactly 0 to -1.

So: accept -> score + 1 (2 for a solved task, 1 for a failed one), refine -> 0.5, reject -> -1.
The gate's own generation is not trained (it is not part of the trajectory in the official code).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

ACCEPT, REFINE, REJECT = "accept", "refine", "reject"
"""``_parse_actor_critic_response``'s verdicts; the credit each gives is
:func:`crl_bench.algorithms.credit.gate_credit`."""

_ANSWER_RE = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)

GATE_SYSTEM = """You are an intelligent actor-critic agent tasked with evaluating and refining \
knowledge retrieved from a knowledge base before using it to guide your decision-making.

Decide on one of three actions:
1. reject: the knowledge is not useful or relevant to your current task, is misleading, or you \
can finish the task on your own (your success rate is high).
2. accept: the knowledge is directly relevant, accurate and actionable as it is.
3. refine: the knowledge contains useful information but needs clarification, generalisation \
or adaptation to your situation; give the improved knowledge.

Consider relevance, accuracy and your historical performance on similar tasks. Be \
conservative: if unsure, prefer refining over rejecting.

Think in <think></think> tags, then output exactly one decision as a JSON object inside \
<answer></answer>:
<answer>{"function_name": "accept", "parameters": {}}</answer>
<answer>{"function_name": "reject", "parameters": {}}</answer>
<answer>{"function_name": "refine", "parameters": {"refined_knowledge": "..."}}</answer>"""
"""A condensed ``ACTOR_CRITIC_SYS_PROMPT_251113`` (same operations, criteria and format)."""


def gate_messages(task_prompt: str, knowledge: str, avg_score: float, traj_count: int
                  ) -> list[dict[str, str]]:
    """The gate's chat messages, as ``ACTOR_CRITIC_USER_PROMPT_251113`` fills them."""
    user = (f"* **Initial Task Prompt:**\n    {task_prompt}\n\n"
            f"* **Knowledge:**\n    {knowledge}\n\n"
            f"* **Historical Performance:**\n    Average score on similar tasks: {avg_score:.2f}\n"
            f"    Total trajectories: {traj_count}\n\n"
            "Now, think carefully and evaluate the knowledge. Formulate your thinking process in "
            "the <think> tags and output your decision as a valid JSON object wrapped in "
            "`<answer>` tags:")
    return [{"role": "system", "content": GATE_SYSTEM}, {"role": "user", "content": user}]


@dataclass(frozen=True)
class GateDecision:
    verdict: str | None
    """accept / refine / reject, or None (unparseable: the knowledge is dropped, no credit)."""
    knowledge: str
    """What the actor is shown: the entry (accept), the refined text (refine), "" otherwise."""


def parse_gate(text: str, knowledge: str) -> GateDecision:
    """``_parse_actor_critic_response``: the last ``<answer>`` block decides."""
    found = _ANSWER_RE.findall(text or "")
    if not found:
        return GateDecision(None, "")
    try:
        decision = json.loads(found[-1].strip())
    except json.JSONDecodeError:
        return GateDecision(None, "")
    if not isinstance(decision, dict):
        return GateDecision(None, "")
    name = decision.get("function_name", "")
    params = decision.get("parameters", {})
    if not isinstance(params, dict):
        return GateDecision(None, "")
    if name == REJECT:
        return GateDecision(REJECT, "")
    if name == ACCEPT:
        return GateDecision(ACCEPT, knowledge)
    if name == REFINE:
        refined = params.get("refined_knowledge", "")
        if isinstance(refined, str) and refined.strip():
            return GateDecision(REFINE, refined.strip())
    return GateDecision(None, "")
