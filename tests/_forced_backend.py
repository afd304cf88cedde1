"""``ForcedBackend``: the real tiny model with the completion *text* chosen by a policy.

Control flow that a sampled model takes only by chance (an ``<ask>``, an invalid format, a
chosen move) is driven exactly, while the completion ids and log-probs stay the model's own
bookkeeping, so everything downstream (credit, training samples) sees genuine records.
"""

from __future__ import annotations

from crl_bench.llm.types import Generation


class ForcedBackend:
    """The real tiny model, but the completion text is chosen by ``policy(prompt_text)``.

    Completion ids are the tokenizer's ids of that text and the log-probs are the model's own
    (``HFBackend.logprobs``), so everything downstream sees genuine bookkeeping.
    """

    def __init__(self, backend, policy):
        self.backend, self.policy = backend, policy
        self.tokenizer = backend.tokenizer
        self.calls: list[int] = []

    def chat_prompt_ids(self, messages):
        return self.backend.chat_prompt_ids(messages)

    def generate(self, prompts, sampling, adapter="actor", *, max_new_tokens=None):
        self.calls.append(len(prompts))
        caps = max_new_tokens or [sampling.max_new_tokens] * len(prompts)
        out = []
        for prompt, cap in zip(prompts, caps):
            text = self.policy(self.tokenizer.decode(prompt))
            ids = self.tokenizer(text, add_special_tokens=False)["input_ids"][:cap]
            lps = self.backend.logprobs([prompt], [ids], adapter)[0]
            out.append(Generation(list(prompt), ids, lps, self.tokenizer.decode(ids),
                                  "stop" if len(ids) < cap else "length"))
        return out
