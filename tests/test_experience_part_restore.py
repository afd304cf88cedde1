"""The bank is restored from a checkpoint by the experience part, like every part's state: the
checkpoint's copy replaces what the run wrote after it, and recency runs on the restored bank's
own clock origin."""

from __future__ import annotations

import time

import numpy as np
import pytest

pytest.importorskip("torch")

from crl_bench.config.schema import build_config  # noqa: E402
from crl_bench.records.files import RunDir  # noqa: E402


def _context(path):
    from crl_bench.run.context import RunContext

    cfg = build_config(agent="comp_rl", tasks="minihack", preset="tiny",
                       overrides={"experience.embedder": "all-MiniLM-L6-v2"})
    ctx = RunContext(cfg, RunDir(path))
    ctx.build_experience()
    return ctx


def _add(manager, title: str) -> None:
    vec = np.asarray(manager.embedder.encode([title]), np.float32)
    manager.bank.add([{"title": title, "content": f"{title}.", "family": "minihack"}], vec, step=1)


def titles(manager) -> list[str]:
    return sorted(e.title for e in manager.bank.get(manager.bank.all_ids()))


def test_the_experience_part_restores_the_bank_of_its_checkpoint(tmp_path):
    a = _context(tmp_path / "a")
    try:
        part = a.experience
        _add(part.manager, "kept")
        folder = tmp_path / "ckpt"
        folder.mkdir()
        state = part.state_dict(folder)
        _add(part.manager, "written after the checkpoint")
        assert titles(part.manager) == ["kept", "written after the checkpoint"]
        part.load_state_dict(state, folder)
        assert titles(part.manager) == ["kept"]     # the later entry belongs to redone work
        _add(part.manager, "after the restore")      # the restored bank is open for writing
        assert titles(part.manager) == ["after the restore", "kept"]
        created_a = float(part.manager.bank.meta["created_at"])
    finally:
        a.close()
    time.sleep(0.05)
    b = _context(tmp_path / "b")  # a bank created afresh (its own creation time)
    try:
        assert float(b.experience.manager.bank.meta["created_at"]) != created_a
        b.experience.load_state_dict(state, folder)
        assert titles(b.experience.manager) == ["kept"]
        b.info.step = 3
        step_s = b.experience.manager.retrieval.step_s
        # recency on the restored bank's clock: its creation + steps (a resume's exact decisions)
        assert b.experience.manager.clock() == pytest.approx(created_a + 3 * step_s, abs=1e-3)
    finally:
        b.close()


def test_the_ray_experience_service_restores_through_a_bank_call(tmp_path):
    """On Ray the part's restore is a call into the experience service (``RemoteManager.bank``
    forwards ``restore`` as ``bank_call``): the service's body restores its open bank the same
    way (run here in-process: the actor's body without a cluster)."""
    pytest.importorskip("ray")
    from crl_bench.distributed.experience import ExperienceServiceImpl

    service = ExperienceServiceImpl(str(tmp_path / "bank.sqlite"), "all-MiniLM-L6-v2", 100,
                                    {"k": 1, "diversify": False}, step_clock=True)
    try:
        _add(service.manager, "kept")
        service.bank_call("backup", (str(tmp_path / "ckpt.sqlite"),), {})
        _add(service.manager, "written after the checkpoint")
        service.bank_call("restore", (str(tmp_path / "ckpt.sqlite"),), {})
        assert titles(service.manager) == ["kept"]
        # a bank file made at another time: the service's recency clock takes its origin
        from crl_bench.experience.bank import ExperienceBank
        time.sleep(0.05)
        other = ExperienceBank(tmp_path / "other.sqlite", dim=service.manager.bank.dim,
                               capacity=100, embedder_name=service.manager.bank.meta.get(
                                   "embedder", "all-MiniLM-L6-v2"))
        created = float(other.meta["created_at"])
        other.close()
        service.bank_call("restore", (str(tmp_path / "other.sqlite"),), {})
        service.set_step(4)
        step_s = service.manager.retrieval.step_s
        assert service.manager.clock() == pytest.approx(created + 4 * step_s, abs=1e-3)
    finally:
        service.manager.bank.close()
