"""A `tiny` run with full fine-tuning (``model.lora_r=0``) on a local Ray cluster: the actor
trains on 2 sharded FSDP2 ranks whose weights reach the generation engine from rank 0, and the
run equals the single-process run (every trajectory, and the metrics within fp32 tolerance but
the token counts of prompt-prefix sharing, which the sharded learner does not do). Killed after
its step-2 checkpoint and resumed to step 3, it still equals the single-process run: the sharded
checkpoint resumes the learner exactly, and the driver's saved model is the ranks' weights."""

from __future__ import annotations

from pathlib import Path

import pytest
from _ray_local import local_ray

ray = pytest.importorskip("ray")
torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from test_ray_run import close, lines, strip_episode, strip_traj, volatile  # noqa: E402

FULL = {"threads": 1, "model.lora_r": 0}
# the single-process trainer encodes a GRPO group's prompt once and orders micro-batches by
# prompt for it; the sharded learner does not. So its encoded-token counts differ, and so does
# ``n_tokens``, a diagnostic that sums each micro-batch's token count weighted by its token share
# (sum of n_c^2 / N: it depends on how the batch is cut; the loss and gradient do not)
PREFIX_COUNTS = ("model_tokens", "shared_tokens", "encoded_tokens", "actor_n_tokens")


def run(out: Path, steps: int, ray_opts=None) -> Path:
    from crl_bench.runner.api import run_experiment

    torch.set_num_threads(1)
    return run_experiment("grpo", "minihack", "tiny", 0, out, steps=steps, overrides=FULL,
                          progress=False, ray=ray_opts)


def metrics(path: Path) -> list[dict]:
    return [{k: v for k, v in m.items() if not volatile(k) and not k.endswith(PREFIX_COUNTS)}
            for m in lines(path / "metrics.jsonl")]


def test_full_fine_tuning_on_ray_equals_one_process_and_resumes(tmp_path):
    ref = run(tmp_path / "single", 3)
    with local_ray(4):
        got = run(tmp_path / "ray", 2, {"plan": "cpu"})
        folders = sorted((got / "learner_checkpoints").iterdir())
        assert [f.name for f in folders] == ["actor_update_000001", "actor_update_000002"]
        assert all((f / ".metadata").is_file() for f in folders)  # sharded (DCP) checkpoints
        got = run(tmp_path / "ray", 3, {"plan": "cpu"})  # resumed from the step-2 checkpoint
    a, b = lines(ref / "episodes.jsonl"), lines(got / "episodes.jsonl")
    assert len(a) == len(b) > 0
    close([strip_episode(x) for x in a], [strip_episode(x) for x in b], "episodes.jsonl")
    ta = sorted(p.relative_to(ref) for p in (ref / "trajectories").glob("*.jsonl.gz"))
    tb = sorted(p.relative_to(got) for p in (got / "trajectories").glob("*.jsonl.gz"))
    assert ta == tb and ta
    for rel in ta:
        close([strip_traj(x) for x in lines(ref / rel)], [strip_traj(x) for x in lines(got / rel)],
              str(rel))
    ma, mb = metrics(ref), metrics(got)
    close(ma, mb, "metrics.jsonl")
    assert sum(1 for m in mb if m.get("losses/actor_loss")) >= 2  # the actor really trained
