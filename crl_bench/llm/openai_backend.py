"""A model behind an OpenAI-compatible HTTP endpoint (vLLM's ``vllm serve``, SGLang, llama.cpp's
server, OpenAI itself), for evaluation only: ``crl-bench eval --endpoint URL --model-id NAME``.

Standard library only (``urllib``): no client package is needed.

The rollout engine speaks token ids (:mod:`crl_bench.llm.rollout`); an endpoint speaks chat
messages. :class:`ChatMLByteTokenizer` bridges the two without the model's own tokenizer: a
"token" is one UTF-8 byte, and the chat template is ChatML (``<|im_start|>role\\n...<|im_end|>``).
:meth:`OpenAIBackend.generate` turns each prompt's ids back into text, reads the ChatML messages
out of it and sends them to ``POST {URL}/chat/completions``; the server applies the model's own
chat template. So windowed and whole-conversation prompts (``rollout.conversation``) both work,
and the completion's "ids" are the bytes of its text (``Generation.text`` is exact; the ids are
not the model's tokens).

What an endpoint cannot give, this backend does not pretend to:

* log-probs: the completion's bytes get log-prob 0.0 (evaluation never reads them);
* training: ``trainable_model``, ``forward_token_logprobs`` and adapters raise
  :class:`EndpointOnly`;
* pre-filled answers (``rollout.response_prefix``, set by ``rollout.small_model_prompt``): sent
  as a final assistant message with ``continue_final_message`` (vLLM, SGLang); other servers
  refuse it, and the error says to turn the pre-fill off;
* token counts: a "token" here is a byte, so ``rollout.max_episode_tokens`` and the episode's
  ``tokens`` count bytes (the server's ``max_tokens`` is capped at the bytes left, never less);
* which stop string ended a completion: vLLM says it (``stop_reason``) and it is appended, as the
  other backends keep it; from other servers a ``</tag>`` stop whose ``<tag>`` is open in the
  text is appended.

Requests run concurrently (``concurrency``, default 8); a failed request is retried
(``retries``) and then raises :class:`EndpointError` naming the URL and the server's answer.
"""

from __future__ import annotations

import json
import re
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Sequence

from crl_bench.llm.types import Generation, SamplingParams

IM_START, IM_END = "<|im_start|>", "<|im_end|>"
_MESSAGE = re.compile(re.escape(IM_START) + r"(system|user|assistant|tool)\n(.*?)(?:"
                      + re.escape(IM_END) + r"\n?|\Z)", re.DOTALL)


class EndpointError(RuntimeError):
    """The endpoint could not be reached or answered with an error."""


class EndpointOnly(NotImplementedError):
    """An endpoint model generates; it cannot be trained or give log-probs."""


class ChatMLByteTokenizer:
    """A tokenizer whose tokens are UTF-8 bytes and whose chat template is ChatML: exactly
    invertible, so that the text of any prompt the engine builds can be sent as messages."""

    eos_token = IM_END
    pad_token = IM_END
    name_or_path = "chatml-bytes"

    def __call__(self, text: str, add_special_tokens: bool = False, **_: Any) -> dict[str, list[int]]:
        return {"input_ids": list(text.encode("utf-8"))}

    def encode(self, text: str, add_special_tokens: bool = False, **_: Any) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False, **_: Any) -> str:
        return bytes(int(i) for i in ids).decode("utf-8", errors="replace")

    def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool = False,
                            tokenize: bool = True, **_: Any) -> Any:
        text = "".join(f"{IM_START}{m['role']}\n{m['content']}{IM_END}\n" for m in messages)
        if add_generation_prompt:
            text += f"{IM_START}assistant\n"
        return self.encode(text) if tokenize else text


def parse_chatml(text: str) -> list[dict[str, str]]:
    """The messages of a ChatML text (the last one may be an open assistant message: a pre-fill)."""
    messages = [{"role": m.group(1), "content": m.group(2)} for m in _MESSAGE.finditer(text)]
    if not messages:
        raise ValueError(f"prompt is not a ChatML conversation: {text[:200]!r}")
    return messages


def _stop_suffix(text: str, stops: Sequence[str]) -> str:
    """For servers that do not say which stop string ended a completion: a ``</tag>`` stop whose
    ``<tag>`` is open at the end of ``text``."""
    for stop in stops:
        if stop.startswith("</") and stop.endswith(">"):
            opening = "<" + stop[2:]
            if text.rfind(opening) > text.rfind(stop):
                return stop
    return ""


class OpenAIBackend:
    """Generation through ``{base_url}/chat/completions`` (see the module docstring).

    Args:
        base_url: the API root, e.g. ``http://127.0.0.1:8000/v1`` (``/v1`` is added when the URL
            has no path).
        model_id: the served model's name (``GET {base_url}/models`` lists them).
        api_key: sent as a bearer token when given (default: ``$OPENAI_API_KEY`` if set).
        concurrency: requests in flight at once.
        timeout_s: per request.
        retries: further attempts after a failed request (connection errors, 429, 5xx).
    """

    keep_kv_across_calls = None  # nothing to keep: the server owns its cache

    def __init__(self, base_url: str, model_id: str, *, roles: tuple[str, ...] = ("actor",),
                 api_key: str | None = None, concurrency: int = 8, timeout_s: float = 600.0,
                 retries: int = 2) -> None:
        import os
        import urllib.parse

        if not base_url or not urllib.parse.urlparse(base_url).scheme.startswith("http"):
            raise ValueError(f"--endpoint {base_url!r} is not an http(s) URL; give the API root, "
                             "e.g. --endpoint http://127.0.0.1:8000/v1")
        if not model_id:
            raise ValueError("--endpoint needs --model-id NAME, the served model's name "
                             f"(GET {base_url.rstrip('/')}/models lists them)")
        url = base_url.rstrip("/")
        if urllib.parse.urlparse(url).path in ("", "/"):
            url += "/v1"
        self.base_url = url
        self.model_id = model_id
        self.model_name = model_id
        self.roles = tuple(roles)
        self.api_key = api_key if api_key is not None else os.environ.get("OPENAI_API_KEY")
        self.concurrency = max(1, int(concurrency))
        self.timeout_s = float(timeout_s)
        self.retries = max(0, int(retries))
        self.tokenizer = ChatMLByteTokenizer()
        self.calls = 0
        """Chat completion requests answered (for logs and tests)."""

    # -- HTTP ------------------------------------------------------------------------------------
    def _request(self, path: str, body: dict[str, Any] | None = None) -> Any:
        headers = {"Content-Type": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        data = None if body is None else json.dumps(body).encode("utf-8")
        url = f"{self.base_url}{path}"
        last: str = ""
        for attempt in range(self.retries + 1):
            req = urllib.request.Request(url, data=data, headers=headers,
                                         method="GET" if body is None else "POST")
            try:
                with urllib.request.urlopen(req, timeout=self.timeout_s) as resp:
                    return json.loads(resp.read().decode("utf-8"))
            except urllib.error.HTTPError as exc:
                detail = exc.read().decode("utf-8", errors="replace")[:500]
                last = f"HTTP {exc.code}: {detail}"
                if exc.code != 429 and exc.code < 500:
                    break  # the request is wrong: asking again will not help
            except (urllib.error.URLError, OSError, ValueError) as exc:
                last = f"{type(exc).__name__}: {getattr(exc, 'reason', exc)}"
            if attempt < self.retries:
                time.sleep(min(2.0 ** attempt, 10.0))
        hint = (" This server cannot continue a pre-filled answer (continue_final_message, "
                "which vLLM and SGLang accept): evaluate with --set rollout.small_model_prompt=false."
                if body and body.get("continue_final_message") and "HTTP 4" in last else "")
        raise EndpointError(f"{url} failed ({last}). Is the server running, and is "
                            f"--model-id {self.model_id!r} one of its models (GET "
                            f"{self.base_url}/models)?" + hint)

    def list_models(self) -> list[str]:
        """The served model names (``GET /models``)."""
        data = self._request("/models")
        return [str(m.get("id")) for m in data.get("data", [])]

    def check(self) -> None:
        """Fail early, naming the fix, when the server is down or does not serve ``model_id``."""
        served = self.list_models()
        if served and self.model_id not in served:
            raise EndpointError(f"{self.base_url} does not serve --model-id {self.model_id!r}; it "
                                f"serves: {', '.join(served)}")

    # -- the backend contract --------------------------------------------------------------------
    def chat_prompt_ids(self, messages: list[dict]) -> list[int]:
        return self.tokenizer.apply_chat_template(messages, add_generation_prompt=True)

    def _one(self, prompt_ids: Sequence[int], sampling: SamplingParams, max_tokens: int,
             seed: int | None) -> Generation:
        messages = parse_chatml(self.tokenizer.decode(prompt_ids))
        prefill = ""
        if messages[-1]["role"] == "assistant":  # the generation prompt, maybe with a pre-fill
            prefill = messages.pop()["content"]
        body: dict[str, Any] = {"model": self.model_id, "messages": messages,
                                "max_tokens": int(max_tokens), "n": 1,
                                "temperature": float(sampling.temperature)}
        if prefill:  # the answer starts with it (PromptConfig.response_prefix): vLLM / SGLang
            body["messages"] = messages + [{"role": "assistant", "content": prefill}]
            body["continue_final_message"], body["add_generation_prompt"] = True, False
        if sampling.top_p < 1.0:
            body["top_p"] = float(sampling.top_p)
        if sampling.top_k > 0:
            body["top_k"] = int(sampling.top_k)  # vLLM / SGLang extension
        if sampling.stop:
            body["stop"] = list(sampling.stop)[:4]  # OpenAI accepts at most 4
        if seed is not None:
            body["seed"] = int(seed) % 2**31
        data = self._request("/chat/completions", body)
        try:
            choice = data["choices"][0]
            text = choice["message"].get("content") or ""
        except (KeyError, IndexError, TypeError) as exc:
            raise EndpointError(f"{self.base_url}/chat/completions answered without a choice: "
                                f"{str(data)[:300]}") from exc
        reason = str(choice.get("finish_reason") or "stop")
        if reason == "stop":
            matched = choice.get("stop_reason")  # vLLM: the stop string, or None/int at eos
            if isinstance(matched, str) and matched:
                text += matched
            elif matched is None and "stop_reason" not in choice:
                text += _stop_suffix(text, sampling.stop)
            if not any(text.endswith(s) for s in sampling.stop):
                reason = "eos"
        elif reason != "length":
            reason = "eos"
        ids = self.tokenizer.encode(text)
        self.calls += 1
        return Generation(prompt_ids=[int(t) for t in prompt_ids], completion_ids=ids,
                          logprobs=[0.0] * len(ids), text=text, finish_reason=reason)

    def generate(self, prompts: Sequence[Sequence[int]] | Sequence[str], sampling: SamplingParams,
                 adapter: Any = "actor", *, max_new_tokens: Sequence[int] | None = None
                 ) -> list[Generation]:
        """One chat completion per prompt, ``concurrency`` at a time, in order."""
        if adapter not in (None, "actor") and adapter not in self.roles:
            raise EndpointOnly(f"an endpoint model serves the actor only, not {adapter!r}")
        ids = [self.tokenizer.encode(p) if isinstance(p, str) else list(p) for p in prompts]
        caps = (list(max_new_tokens) if max_new_tokens is not None
                else [sampling.max_new_tokens] * len(ids))
        caps = [max(1, min(int(c), sampling.max_new_tokens)) for c in caps]
        seeds = [None if sampling.seed is None else int(sampling.seed) + i for i in range(len(ids))]
        if len(ids) <= 1:
            return [self._one(p, sampling, c, s) for p, c, s in zip(ids, caps, seeds)]
        with ThreadPoolExecutor(max_workers=min(self.concurrency, len(ids))) as pool:
            return list(pool.map(lambda a: self._one(*a), zip(ids, [sampling] * len(ids), caps,
                                                               seeds)))

    def logprobs(self, *_: Any, **__: Any) -> list[list[float]]:
        raise EndpointOnly("an endpoint model gives no log-probs of given completions")

    def trainable_model(self, adapter: str) -> Any:
        raise EndpointOnly("an endpoint model cannot be trained; evaluate it with crl-bench eval")

    trainable_parameters = forward_token_logprobs = trainable_model

    def after_update(self, adapter: str) -> None:
        raise EndpointOnly("an endpoint model cannot be trained")

    def save_adapters(self, directory: Any) -> None:
        """Nothing to save: the weights live on the server."""

    def load_adapters(self, directory: Any) -> None:
        raise EndpointOnly("an endpoint model's weights live on the server; serve the checkpoint "
                           "there, or evaluate RUN_DIR itself (crl-bench eval RUN_DIR)")

    def close(self) -> None:
        """Nothing held: each request has its own connection."""
