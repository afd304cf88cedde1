"""Calls into a backend shared by the roles: a lock that times who waited for it, the backend
behind it, and the extractor role's batched call (a pre-filled assistant turn continued)."""

from __future__ import annotations

import dataclasses
import threading
import time
from typing import Any


class WaitTimingLock:
    """An RLock that adds the time each thread spent blocked on it to ``waits[thread name]``."""

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self.waits: dict[str, float] = {}
        self._meta = threading.Lock()

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        if self._lock.acquire(blocking=False):
            return True
        start = time.perf_counter()
        ok = self._lock.acquire(blocking, timeout)
        waited = time.perf_counter() - start
        name = threading.current_thread().name
        with self._meta:
            self.waits[name] = self.waits.get(name, 0.0) + waited
        return ok

    def release(self) -> None:
        self._lock.release()

    def __enter__(self) -> "WaitTimingLock":
        self.acquire()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.release()

    def take_wait(self, name: str) -> float:
        with self._meta:
            return self.waits.pop(name, 0.0)


class LockedBackend:
    """Proxy that holds the model lock around every call into the backend."""

    def __init__(self, backend: Any, lock: WaitTimingLock) -> None:
        self._backend = backend
        self._lock = lock

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._backend, name)
        if name == "tokenizer":  # callable itself, and its methods (apply_chat_template) too
            return LockedBackend(attr, self._lock)
        if not callable(attr):
            return attr

        def call(*args: Any, **kwargs: Any) -> Any:
            with self._lock:
                return attr(*args, **kwargs)
        return call

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        with self._lock:
            return self._backend(*args, **kwargs)


def extractor_generate(backend: Any, sampling: Any, message_lists: list[list[dict]],
                       stop: tuple[str, ...] = ()) -> list[Any]:
    """One batched extractor call. A message list ending with an assistant message is a pre-fill:
    the assistant turn starts with that text (prompt tokens) and the model continues it.
    ``stop`` replaces the default stop strings."""
    prompts = []
    for m in message_lists:
        if m and m[-1].get("role") == "assistant":
            ids = backend.chat_prompt_ids(m[:-1])
            ids += backend.tokenizer(m[-1]["content"], add_special_tokens=False)["input_ids"]
        else:
            ids = backend.chat_prompt_ids(m)
        prompts.append(ids)
    if stop:
        sampling = dataclasses.replace(sampling, stop=tuple(stop))
    return backend.generate(prompts, sampling, adapter="extractor")
