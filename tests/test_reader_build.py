"""``crl-bench build-model smollm2-135m-reader`` builds the reader into the cache by one command
(here with a tiny recipe on the 2-layer test model, so that it runs in seconds): a loadable
checkpoint whose weights moved from the base, built the same way twice, with its recipe and data
check beside it; and the reader's prompts are the rollout engine's, token for token."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("torch")
pytest.importorskip("peft")
pytest.importorskip("nle")


def _tiny_recipe():
    from crl_bench.llm.models import resolve_model
    from crl_bench.builds.reader import ReaderRecipe

    return ReaderRecipe(base=resolve_model("tiny-random"), examples=16, batch=8, lr=1e-2,
                        warmup_steps=1)


def test_build_model_command_builds_the_reader_into_the_cache(tmp_path, monkeypatch, capsys):
    import torch
    from safetensors.torch import load_file

    from crl_bench import cli
    from crl_bench.llm.models import KNOWN_MODELS, load_causal_lm
    from crl_bench.builds import reader

    recipe = _tiny_recipe()
    base = load_file(f"{recipe.base}/model.safetensors")
    monkeypatch.setattr(reader, "RECIPE", recipe)
    monkeypatch.setenv("CRL_BENCH_CACHE", str(tmp_path / "cache"))
    assert cli.main(["build-model", "smollm2-135m-reader"]) == 0
    folder = capsys.readouterr().out.strip().splitlines()[-1]
    assert folder == str(tmp_path / "cache" / "models" / KNOWN_MODELS["smollm2-135m-reader"].folder)
    info = json.loads((tmp_path / "cache" / "models" / KNOWN_MODELS[
        "smollm2-135m-reader"].folder / reader.READER_FILE).read_text())
    assert info["examples"] == 16 and info["steps"] == 2 and len(info["losses"]) == 2
    assert info["data_check"]["all"]["n"] == 16
    weights = load_file(f"{folder}/model.safetensors")
    assert set(weights) == set(base)
    moved = [k for k in base if not torch.equal(base[k].float(), weights[k].float())]
    assert any("q_proj" in k for k in moved) and not any("norm" in k for k in moved)
    model = load_causal_lm(folder, device="cpu")  # an ordinary checkpoint: the runner loads it
    assert not any("lora" in name for name, _ in model.named_parameters())
    # the second call finds it in the cache
    assert cli.main(["build-model", "smollm2-135m-reader"]) == 0
    assert capsys.readouterr().out.strip() == folder


def test_build_is_deterministic(tmp_path):
    from safetensors.torch import load_file

    from crl_bench.builds.reader import build_reader

    recipe = _tiny_recipe()
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        build_reader(tmp_path / name, recipe, log=lambda _: None)
    a, b = (load_file(str(tmp_path / n / "model.safetensors")) for n in ("a", "b"))
    assert all((a[k] == b[k]).all() for k in a)


def test_reader_prompts_are_the_engines(tmp_path):
    """The warm start's prompt ids equal the rollout engine's first-turn prompt ids under the
    reader comparison's settings (with and without an entry, with Search-and-Ask offered)."""
    import gymnasium

    from crl_bench.llm.models import load_tokenizer
    from crl_bench.llm.rollout import EpisodeSpec
    from crl_bench.run.context import RunContext
    from crl_bench.builds.reader import (ENV_ID, FIRST_LEVEL, RECIPE, examples, prompt_config,
                                         reader_config, tokenized)
    from crl_bench.records.files import RunDir

    cfg = reader_config(model="tiny-random")
    cfg.validate()
    ctx = RunContext(cfg, RunDir(tmp_path / "run"))
    ctx.build_models(extractor=False)
    data = examples(RECIPE, n=6)
    env = gymnasium.make(ENV_ID, view="compact", max_steps=1)
    goal = env.reset(seed=FIRST_LEVEL)[1]["goal"]
    ids = tokenized(data, load_tokenizer("tiny-random"), prompt_config(cfg), goal)
    assert prompt_config(cfg) == ctx.player.engine(None, 0).prompt
    for i, (ex, (prompt, target)) in enumerate(zip(data, ids)):
        engine = ctx.player.engine((lambda q, s, m: "") if ex.asks_left else None, 0)
        # the runs offer no ask on an episode's last turn (experience.ask_on_last_turn=false),
        # so a one-action level's prompt never has the ask sentence; the warm start also shows
        # it (asks_left), as the engine builds it when an ask is offered on that turn
        engine.ask_on_last_turn = bool(ex.asks_left)
        # a prompt offered Search-and-Ask without an entry is a with-experience episode whose
        # retrieval returned nothing (the runs offer asks to with-experience episodes only)
        spec = EpisodeSpec(env=env, seed=ex.level,
                           with_experience=bool(ex.experience_text or ex.asks_left),
                           experience_text=ex.experience_text)
        assert engine.first_prompt(spec, i)[0] == prompt
        assert ctx.backend.tokenizer.decode(target).startswith(f"{ex.target}</answer>")
    env.close()
