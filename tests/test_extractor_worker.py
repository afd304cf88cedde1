"""The extractor in its own process (``extractor.runs: process``, crl_bench/extractor/worker.py).

Real parts throughout: the worker is a real child process building the ``tiny-random`` /
``tiny-sft`` models; its generations and updates are compared with the same calls in this
process; runs are real ``tiny`` comp_rl runs.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

torch = pytest.importorskip("torch")

from crl_bench.llm.types import LoraSpec, SamplingParams  # noqa: E402

SPEC = dict(model_name="tiny-random", roles=("actor", "extractor"), lora=LoraSpec(r=4, alpha=8),
            dtype="float32", device="cpu", seed=0)
MESSAGES = [[{"role": "user", "content": "Goal: reach the stairs. What did you learn?"}],
            # a pre-filled answer: the model continues the assistant turn
            [{"role": "user", "content": "Summarise the episode."},
             {"role": "assistant", "content": "Tip: always"}]]


def _local():
    from crl_bench.llm.hf_backend import HFBackend

    torch.set_num_threads(1)
    return HFBackend(**SPEC)


def _optim():
    from crl_bench.config.schema import ExtractorConfig

    return ExtractorConfig(lr=1e-2, micro_batch_size=2)


@pytest.fixture(scope="module")
def worker():
    from crl_bench.extractor.worker import ProcessHost

    w = ProcessHost("hf", SPEC, SamplingParams(temperature=1.0, max_new_tokens=6),
                        _optim(), total_steps=4, trainer_seed=1)
    yield w
    w.close()


def test_worker_generates_what_the_main_process_generates(worker):
    """Same weights, same sampling seed: the same tokens, and log-probs within the backend
    tests' bound (tests/test_llm_hf_backend.py, atol 1e-5)."""
    from crl_bench.run.context import extractor_generate

    local = _local()
    for seed in (3, 11):
        got = worker.generate(MESSAGES, stop=(), seed=seed)
        want = extractor_generate(local, SamplingParams(temperature=1.0, max_new_tokens=6, seed=seed),
                                  MESSAGES)
        for g, w in zip(got, want):
            assert g.prompt_ids == w.prompt_ids and g.completion_ids == w.completion_ids
            assert g.text == w.text
            assert torch.allclose(torch.tensor(g.logprobs), torch.tensor(w.logprobs), atol=1e-5)
    other = worker.generate(MESSAGES, stop=(), seed=4)
    assert [g.completion_ids for g in other] != [g.completion_ids for g in got]


def test_worker_update_moves_the_weights_as_an_in_process_update(worker):
    """One CISPO update in the worker and one by a RoleTrainer here, on the same samples from
    the same start: the same weights after (fp32), and they moved."""
    from crl_bench.training.precision import role_weights
    from crl_bench.llm.types import TrainSample
    from crl_bench.training.role_trainer import RoleTrainer

    local = _local()
    worker.load_weights(role_weights(local, "extractor"))
    trainer = RoleTrainer(local, "extractor", _optim(), total_steps=4, seed=1)
    worker.load_state_dict(trainer.state_dict())
    gens = worker.generate(MESSAGES, stop=(), seed=5)
    samples = [TrainSample(g.prompt_ids, g.completion_ids, g.logprobs, adv)
               for g, adv in zip(gens, (1.0, -1.0))]
    before = role_weights(local, "extractor")
    kwargs = dict(loss="cispo", loss_kwargs={}, agg="token-mean", temperature=1.0)
    m_worker = worker.update(samples, **kwargs)
    m_local = trainer.update(samples, **kwargs)
    after_worker, after_local = worker.weights(), role_weights(local, "extractor")
    moved = max(float((a - b).abs().max()) for a, b in zip(after_local, before))
    assert moved > 1e-4, "the in-process update did not move the extractor's weights"
    for a, b in zip(after_worker, after_local):
        assert torch.allclose(a, b, atol=1e-6, rtol=1e-5)
    assert worker.updates == trainer.updates == 1
    assert m_worker["loss"] == pytest.approx(m_local["loss"], abs=1e-6)


def test_an_error_in_the_worker_is_raised_here_with_its_traceback(worker):
    from crl_bench.extractor.worker import WorkerError

    with pytest.raises(WorkerError) as err:
        worker.load_weights([torch.zeros(3)])  # not the extractor's weights: refused there
    text = str(err.value)
    assert "failed in load_weights()" in text and "the worker's traceback" in text
    assert "Traceback (most recent call last)" in text
    assert worker.generate(MESSAGES[:1], seed=1)  # the worker still serves after an error


def test_a_dead_worker_is_a_clear_error_not_a_hang_and_weights_answer_during_generation():
    from crl_bench.extractor.worker import ProcessHost, WorkerDied

    w = ProcessHost("hf", SPEC, SamplingParams(temperature=1.0, max_new_tokens=4000))
    try:
        import threading

        box = {}

        def call():
            try:
                w.generate(MESSAGES * 8, seed=1)  # long: the kill lands while it runs
            except BaseException as exc:  # noqa: BLE001
                box["exc"] = exc
        t = threading.Thread(target=call)
        t.start()
        time.sleep(1.0)
        # weights and state are served beside a running generation (a checkpoint does not
        # wait for a distillation batch)
        assert len(w.snapshot()["weights"]) == len(w.weights()) > 0
        assert t.is_alive(), "the generation ended before the snapshot: the test proves nothing"
        os.kill(w.pid, signal.SIGKILL)
        t.join(timeout=30)
        assert not t.is_alive(), "the call hung after the worker died"
        assert isinstance(box.get("exc"), WorkerDied), box
        assert "killed by signal 9" in str(box["exc"])
        with pytest.raises(WorkerDied):  # and every later call says so at once
            w.weights()
    finally:
        w.close()


def test_the_worker_does_not_outlive_its_parent(tmp_path):
    """A parent SIGKILLed (no cleanup) takes its worker with it."""
    code = ("import sys, time; from crl_bench.extractor.worker import ProcessHost; "
            "from crl_bench.llm.types import LoraSpec, SamplingParams; "
            f"w = ProcessHost('hf', {SPEC!r}, SamplingParams()); "
            "print(w.pid, flush=True); time.sleep(600)")
    parent = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True,
                              env=dict(os.environ, OMP_NUM_THREADS="1"))
    try:
        child = int(parent.stdout.readline())
        os.kill(parent.pid, signal.SIGKILL)
        parent.wait(timeout=30)
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and _alive(child):
            time.sleep(0.2)
        assert not _alive(child), "the worker outlived its parent"
    finally:
        if parent.poll() is None:
            parent.kill()


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:  # a zombie (reaped by init soon) counts as gone
            return fh.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


# -- in a run -----------------------------------------------------------------------------------
def _loop(tmp_path, name, **overrides):
    pytest.importorskip("nle")
    import crl_bench  # noqa: F401  (registers the crl/ envs)
    from crl_bench.agent import load_agent
    from crl_bench.config.schema import build_config
    from crl_bench.run.loop import RunLoop
    from crl_bench.records.files import RunDir

    cfg = build_config(agent="comp_rl", tasks="minihack", preset="tiny", overrides={
        "threads": 1, "extractor.runs": "process", **overrides})
    loop = RunLoop(cfg, load_agent("comp_rl"), RunDir(tmp_path / name), progress=False)
    loop.setup()
    return loop


def _extractor_batch(ctx, seed):
    from crl_bench.llm.types import TrainSample

    gens = ctx.ext_host.generate(MESSAGES, seed=seed)
    return [TrainSample(g.prompt_ids, g.completion_ids, g.logprobs, a)
            for g, a in zip(gens, (1.0, -0.5))]


def _extractor_work(ctx, batch):
    """One update, then an unseeded generation (the worker's own RNG): what a resumed run
    must repeat exactly."""
    e = ctx.cfg.extractor
    ctx.extractor_trainer.update(batch, loss=e.loss, loss_kwargs=e.loss_kwargs(), agg=e.agg,
                                 temperature=1.0)
    gens = ctx.extractor_generate(MESSAGES)
    return ctx.ext_host.weights(), [(g.completion_ids, g.logprobs) for g in gens]


def test_checkpoint_then_resume_continues_the_worker_exactly(tmp_path):
    """A checkpoint written with the extractor in its worker holds the worker's weights,
    optimizer state and RNG: a fresh run loaded from it makes the same next update and samples
    the same tokens as the run that went on; one that was not loaded does not."""
    a = _loop(tmp_path, "a")
    try:
        ctx = a.ctx
        assert ctx.extractor_runs == "process" and ctx.ext_host is not None
        _extractor_work(ctx, _extractor_batch(ctx, 1))  # the extractor has trained: Adam state
        a.save_checkpoint(1)
        ckpt = a.run.last_checkpoint()
        batch = _extractor_batch(ctx, 2)
        want_w, want_g = _extractor_work(ctx, batch)
    finally:
        a.close()
    b = _loop(tmp_path, "b")
    c = _loop(tmp_path, "c")
    try:
        b.load_checkpoint(ckpt)
        got_w, got_g = _extractor_work(b.ctx, batch)
        assert b.ctx.extractor_trainer.updates == 2
        assert got_g == want_g
        for x, y in zip(got_w, want_w):
            assert torch.equal(x, y)
        lost_w, lost_g = _extractor_work(c.ctx, batch)  # not loaded: another state
        assert lost_g != want_g or any(not torch.equal(x, y) for x, y in zip(lost_w, want_w))
    finally:
        b.close()
        c.close()


@pytest.mark.slow
def test_a_tiny_comp_rl_run_with_the_extractor_in_its_process(tmp_path):
    """The run finishes, its extractor trains in the worker, and the last checkpoint holds the
    worker's weights as they were when it was written (the main process never trains them)."""
    from crl_bench.training.precision import role_weights
    from crl_bench.llm.hf_backend import HFBackend
    from crl_bench.run import loop as loop_mod
    from crl_bench.runner.api import run_experiment
    from crl_bench.records.files import RunDir, read_jsonl

    at_checkpoint = {}

    def record(moment, step, trainer):
        if moment == "checkpoint" and step == 3:  # inside save_checkpoint, after the pull
            at_checkpoint["weights"] = trainer.ctx.ext_host.weights()
            at_checkpoint["updates"] = trainer.ctx.ext_host.updates

    loop_mod.HOOKS.append(record)
    try:
        out = run_experiment("comp_rl", "minihack", "tiny", 0, tmp_path / "run", steps=3,
                             progress=False, overrides={"threads": 1, "extractor.runs": "process"})
    finally:
        loop_mod.HOOKS.remove(record)
    metrics = read_jsonl(out / "metrics.jsonl")
    assert max(m.get("extractor/updates", 0) for m in metrics) > 0
    assert all(m["timing_s/extractor_wait"] >= 0 for m in metrics if m["step"] > 0)
    saved = HFBackend("tiny-sft", roles=("actor", "extractor"), lora=LoraSpec(r=4, alpha=8), seed=0)
    start = role_weights(saved, "extractor")
    saved.load_adapters(RunDir(out).last_checkpoint() / "adapters")
    got = role_weights(saved, "extractor")
    for x, y in zip(got, at_checkpoint["weights"]):
        assert torch.equal(x, y), "the checkpoint does not hold the worker's extractor weights"
    # an update that stepped (not skipped for want of a non-zero advantage) moved them
    moved = any(not torch.equal(x, y) for x, y in zip(got, start))
    assert moved == (at_checkpoint["updates"] > 0)


def test_a_worker_killed_mid_run_ends_the_run_with_a_clear_error(tmp_path):
    from crl_bench.run import loop as loop_mod
    from crl_bench.runner.api import run_experiment

    def kill_worker(moment, step, trainer):
        if moment == "episodes" and step == 1:
            os.kill(trainer.ctx.ext_host.pid, signal.SIGKILL)

    loop_mod.HOOKS.append(kill_worker)
    try:
        with pytest.raises(RuntimeError, match=r"extractor worker process .* is gone \(killed by signal 9\)"):
            run_experiment("comp_rl", "minihack", "tiny", 0, tmp_path / "run", steps=3,
                           progress=False, overrides={"threads": 1, "extractor.runs": "process"})
    finally:
        loop_mod.HOOKS.remove(kill_worker)


def test_process_with_shared_parameters_runs_as_thread(tmp_path, capsys):
    pytest.importorskip("nle")
    from crl_bench.agent import load_agent
    from crl_bench.config.schema import build_config
    from crl_bench.run.context import RunContext
    from crl_bench.records.files import RunDir

    cfg = build_config(agent="comp_rl_shared_params", tasks="minihack", preset="tiny",
                       overrides={"threads": 1, "extractor.runs": "process"})
    ctx = RunContext(cfg, RunDir(tmp_path / "shared_params"))
    ctx.seed_everything()
    try:
        load_agent("comp_rl_shared_params").build(ctx)
        assert ctx.extractor_runs == "thread" and ctx.ext_host.local
        assert ctx.extractor.asynchronous
    finally:
        ctx.close()
    assert "share their parameters" in capsys.readouterr().err


def test_a_resumed_run_may_change_where_its_extractor_runs():
    """Where the extractor runs sets how fast a run goes, not what it computes: --resume may
    change it (the checkpoint holds the same adapters and trainer state either way)."""
    from crl_bench.config.schema import ConfigError, apply_resume_overrides, build_config

    cfg = build_config(agent="comp_rl", tasks="minihack", preset="tiny")
    assert apply_resume_overrides(cfg, {"extractor.runs": "process"}).extractor.runs == "process"
    with pytest.raises(ConfigError):  # what it computes stays refused
        apply_resume_overrides(cfg, {"extractor.lr": 0.5})
