"""Fault injection for the resume tests: run the CLI with a hook that SIGKILLs the process.

    python tests/_faults.py <moment>[@<step>] run --agent ... --out RUN

installs, in :data:`crl_bench.run.loop.HOOKS`, a hook that kills the process the first time the
run reaches ``moment`` (at actor step ``step`` when given): ``startup``, ``episodes`` and
``checkpoint`` are the loop's own moments (:data:`crl_bench.run.loop.MOMENTS`); ``rollout``
kills after an actor generation call of the step (its retrievals already counted in the bank).
A real SIGKILL: no handler, no cleanup, as a crash or the OOM killer would end the run.
"""

from __future__ import annotations

import os
import signal
import sys
from typing import Any


def _kill() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def install(spec: str) -> None:
    from crl_bench.run import loop

    name, _, at = spec.partition("@")
    want = int(at) if at else None
    if name not in (*loop.MOMENTS, "rollout") or name == "steps":
        raise ValueError(f"unknown moment {name!r}")

    def hook(moment: str, step: int | None, trainer: Any) -> None:
        if name == "rollout" and moment == "steps":  # wrap the actor's generation calls
            ctx = trainer.ctx
            generate = ctx.backend.generate

            def killing_generate(*args: Any, **kwargs: Any) -> Any:
                out = generate(*args, **kwargs)
                adapter = kwargs.get("adapter", args[2] if len(args) > 2 else "actor")
                if adapter == "actor" and (want is None or ctx.step == want):
                    _kill()
                return out
            ctx.backend.generate = killing_generate
        elif moment == name and (want is None or step == want):
            _kill()
    loop.HOOKS.append(hook)


if __name__ == "__main__":
    install(sys.argv[1])
    from crl_bench.cli import main

    sys.exit(main(sys.argv[2:]))
