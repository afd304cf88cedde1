"""What would stop the ``paper`` preset on GPUs at its first step, reproduced on CPU.

* The learners' process group on GPUs: ``init_process_group("nccl")`` maps only the ``cuda``
  device, so the metric sums (a CPU float64 tensor) and the object collectives fail on the
  first update. Reproduced here with the same device map over gloo: every ``nccl`` of the
  backend string :func:`~crl_bench.distributed.learner.join_group` asks for becomes ``gloo``
  on the device it names (plain ``"nccl"`` -> ``"cuda:gloo"``), and the real sharded learner
  runs one update, its metric sums and its weight gather on that group.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")


def _as_gloo(backend: str) -> str:
    """The device map of ``backend`` with NCCL's place taken by gloo (CPU has no NCCL):
    ``"nccl"`` -> ``"cuda:gloo"`` (what torch maps a plain "nccl" to), ``"cpu:gloo,cuda:nccl"``
    -> ``"cpu:gloo,cuda:gloo"``."""
    if backend == "nccl":
        return "cuda:gloo"
    return backend.replace("nccl", "gloo")


@pytest.fixture
def nccl_device_map(monkeypatch):
    """``join_group`` with a GPU spec, its process group built with NCCL's device map over
    gloo; the group is destroyed afterwards."""
    import torch.distributed as dist

    real_init = dist.init_process_group
    seen: list[str] = []

    def init(backend=None, *args, **kwargs):
        seen.append(backend)
        return real_init(_as_gloo(backend), *args, **kwargs)

    monkeypatch.setattr(dist, "init_process_group", init)
    monkeypatch.setattr(torch.cuda, "set_device", lambda *_: None)  # no GPU here
    yield seen
    if dist.is_initialized():
        dist.destroy_process_group()


def test_learner_group_on_gpus_carries_cpu_collectives(nccl_device_map):
    """Blocker: the first actor update on NCCL died in ``sum_over_ranks`` (a CPU tensor on a
    group whose device map has no ``cpu``). The group join_group builds for a GPU spec must
    carry the metric sums, the object collectives and a whole sharded update."""
    from _fsdp_worker import CFG, KW, batch

    from crl_bench.distributed.fsdp import ShardedLearner
    from crl_bench.distributed.learner import _free_port, join_group, sum_over_ranks
    from crl_bench.runner.config import OptimConfig

    torch.set_num_threads(1)
    join_group({"device": "cuda"}, 0, 1, ("127.0.0.1", _free_port()))
    assert nccl_device_map and "nccl" in nccl_device_map[0]  # NCCL for the GPU tensors
    import torch.distributed as dist

    # with the plain "nccl" map: "No backend type associated with device type cpu"
    scal = torch.tensor([1.0, 2.0], dtype=torch.float64)
    dist.all_reduce(scal)
    assert scal.tolist() == [1.0, 2.0]
    out = sum_over_ranks(1.5, {"ratio": 2.0, "clip_frac": 0.25})
    assert out == {"ratio": 2.0, "clip_frac": 0.25, "loss": 1.5}
    # the real learner on that group (its model on CPU: the collectives are what is tested)
    learner = ShardedLearner(dict(model_name="tiny-random", seed=0, device="cpu"), "actor",
                             OptimConfig(**CFG), total_steps=4, seed=0)
    before = [w.clone() for w in learner.full_weights()]
    metrics = learner.update(batch(0), **KW)
    assert metrics["skipped"] == 0.0 and torch.isfinite(torch.tensor(metrics["loss"]))
    after = learner.full_weights()
    assert any(not torch.equal(a, b) for a, b in zip(before, after))
