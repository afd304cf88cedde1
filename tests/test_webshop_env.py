"""The WebShop text env on the real 1,000-product catalogue: contract, pages, goals, reward."""

from __future__ import annotations

import os
import subprocess
import sys

import gymnasium
import pytest

import crl_bench  # noqa: F401  (registers the envs)
from _data_paths import missing_data_reason, shared_data_dir
from crl_bench.data import DataNotFoundError
from crl_bench.env_check import check_text_env

DATA = shared_data_dir("webshop")
needs_data = pytest.mark.skipif(DATA is None, reason=missing_data_reason("webshop"))


def make(**kwargs):
    kwargs.setdefault("data_dir", str(DATA))
    return gymnasium.make(kwargs.pop("env_id", "crl/WebShop-v0"), **kwargs)


def title_of(env, asin):
    return env.unwrapped.data.by_asin[asin]["Title"]


def test_registration_is_cheap():
    code = ("import sys, crl_bench; from crl_bench.registry import ENVS; "
            "assert 'crl/WebShop-v0' in ENVS and 'crl/WebShop-Human-v0' in ENVS; "
            "heavy = [m for m in ('bm25s', 'spacy', 'thefuzz', 'Stemmer', "
            "'crl_bench.envs.webshop.env') if m in sys.modules]; print(heavy)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_missing_data_names_the_env_var_and_the_download_command(tmp_path, monkeypatch):
    monkeypatch.setenv("CRL_BENCH_WEBSHOP_DATA", str(tmp_path / "nowhere"))
    monkeypatch.delenv("CRL_BENCH_DATA", raising=False)
    monkeypatch.setenv("CRL_BENCH_CACHE", str(tmp_path / "cache"))
    with pytest.raises(DataNotFoundError) as err:
        gymnasium.make("crl/WebShop-v0")
    message = str(err.value)
    assert "CRL_BENCH_WEBSHOP_DATA" in message
    assert "python -m crl_bench.envs.webshop.download --size small" in message


def test_bad_constructor_arguments_say_what_is_allowed():
    # checked before any data is read, so no data folder is needed
    with pytest.raises(ValueError, match="split 'validation' is unknown"):
        gymnasium.make("crl/WebShop-v0", split="validation")
    with pytest.raises(ValueError, match="goal_source 'robots' is unknown"):
        gymnasium.make("crl/WebShop-v0", goal_source="robots")
    with pytest.raises(ValueError, match="observation_mode"):
        gymnasium.make("crl/WebShop-v0", observation_mode="html")


@needs_data
@pytest.mark.parametrize("env_id, kwargs", [
    ("crl/WebShop-v0", {}),
    ("crl/WebShop-v0", {"split": "test", "observation_mode": "text_rich"}),
    ("crl/WebShop-Human-v0", {}),
])
def test_check_text_env_passes(env_id, kwargs):
    report = check_text_env(env_id, make_kwargs={"data_dir": str(DATA), **kwargs}, n_random_steps=25)
    assert len(report.checks) == 7  # gym, reset, fuzz+clean text, options, episode end, determinism, close


@needs_data
def test_goal_counts_and_splits_follow_webshop():
    env = make(split="train")
    u = env.unwrapped
    assert len(u.goals) == 6910
    assert len(u.task_ids()) == 5410 and u.task_ids()[0] == "1500"
    assert len(make(split="test").unwrapped.task_ids()) == 500
    assert make(split="dev").unwrapped.task_ids()[-1] == "1499"
    human = make(env_id="crl/WebShop-Human-v0").unwrapped
    assert len(human.goals) == 13
    with pytest.raises(ValueError, match="no human goals"):
        make(env_id="crl/WebShop-Human-v0", split="train")


@needs_data
def test_goal_text_and_order_match_webshop():
    # Goal 490 as a recorded WebShop run showed it (same shuffle, same price bound).
    env = make(split="test")
    obs, info = env.reset(options={"task_id": 490})
    assert info["goal"] == ("Find me eco friendly throw blankets with fleece throw with color: "
                            "tortoisegoo9511, and size: 39x49in, and price lower than 60.00 dollars")
    assert obs == f"WebShop [SEP] Instruction: [SEP] {info['goal']} [SEP] Search"
    assert info["admissible_actions"] == ["search[<query>]"]
    assert info["task_id"] == "490" and info["search_available"]


@needs_data
def test_reset_draws_from_the_split_and_is_seeded():
    env = make(split="test")
    ids = {env.reset(seed=s)[1]["task_id"] for s in range(20)}
    assert all(0 <= int(i) < 500 for i in ids) and len(ids) > 10
    assert env.reset(seed=3)[1]["task_id"] == env.reset(seed=3)[1]["task_id"]
    with pytest.raises(ValueError, match="task_id"):
        env.reset(options={"task_id": 99999})


@needs_data
@pytest.mark.parametrize("action, why", [
    ("click[", "not search"),
    ("search[]", "needs keywords"),
    ("search[   ]", "needs keywords"),
    ("click[]]", "no clickable"),
    ("]]][[[", "not search"),
    ("click[no such button]", "no clickable"),
    ("click[search]", "no clickable"),  # WebShop does not let the search button be clicked
    ("buy[now]", "unknown action"),
    ("click[buy now]", "no clickable"),  # not on the search page
    ("", "not search"),
])
def test_invalid_actions_are_feedback(action, why):
    env = make(split="test")
    obs0, _ = env.reset(options={"task_id": 7})
    obs, reward, terminated, truncated, info = env.step(action)
    assert not info["action_valid"] and why in obs
    assert obs.endswith(obs0)  # the page is unchanged
    assert (reward, terminated, truncated) == (0.0, False, False)


@needs_data
def test_ten_thousand_character_query_is_answered():
    env = make(split="test")
    env.reset(options={"task_id": 7})
    obs, _r, _t, _tr, info = env.step("search[" + "organic green tea " * 600 + "]")
    assert info["action_valid"] and info["page"] == "results"
    obs, _r, _t, _tr, info = env.step("search[" + "x" * 10_000 + "]")  # no search box here
    assert not info["action_valid"]
    env.reset(options={"task_id": 7})
    obs, _r, _t, _tr, info = env.step("search[" + "x" * 10_000 + "]")  # matches nothing
    assert info["action_valid"] and "(Total results: 0)" in obs


@needs_data
def test_pages_navigation_and_options():
    env = make(split="test")
    u = env.unwrapped
    _obs, info = env.reset(options={"task_id": 490})
    obs, _r, _t, _tr, info = env.step("search[eco friendly fleece throw blanket tortoisegoo9511 39x49in under 60]")
    assert "Page 1 (Total results: 50) [SEP] Next > [SEP] B09DG3YTHY" in obs
    assert "click[< prev]" not in info["admissible_actions"]
    obs, _r, _t, _tr, info = env.step("click[Next >]")
    assert "Page 2 (Total results: 50) [SEP] < Prev [SEP] Next >" in obs
    obs, _r, _t, _tr, info = env.step("click[< prev]")
    assert "Page 1 (Total results: 50)" in obs
    obs, _r, _t, _tr, info = env.step("click[B09DG3YTHY]")  # upper case works, as in WebShop
    assert info["page"] == "item" and "[SEP] size [SEP] 39 x 49 in [SEP] 39x49in" in obs
    assert obs.endswith("[SEP] Description [SEP] Features [SEP] Reviews [SEP] Buy Now")
    env.step("click[tortoisegoo9511]")
    assert u.session.options == {"color": "tortoisegoo9511"}
    obs, _r, _t, _tr, info = env.step("click[features]")
    assert info["page"] == "sub_page" and info["clickables"] == ["back to search", "< prev"]
    obs, _r, _t, _tr, info = env.step("click[< prev]")
    assert info["page"] == "item" and u.session.options == {"color": "tortoisegoo9511"}
    env.step("click[< prev]")  # back to the results: the item and options are cleared
    assert u.session.options == {} and u.session.asin is None
    obs, _r, _t, _tr, info = env.step("click[back to search]")
    assert info["page"] == "search" and obs.startswith("WebShop [SEP] Instruction:")


@needs_data
def test_purchase_terminates_with_webshop_reward_and_done_page():
    env = make(split="test")
    env.reset(options={"task_id": 490})
    env.step("search[eco friendly fleece throw blanket tortoisegoo9511 39x49in under 60]")
    env.step("click[b09dg3ythy]")
    env.step("click[tortoisegoo9511]")
    env.step("click[39x49in]")
    obs, reward, terminated, truncated, info = env.step("click[buy now]")
    assert (reward, terminated, truncated) == (1.0, True, False)
    assert info["success"] and info["score"] == 1.0 and info["admissible_actions"] == []
    assert info["purchased_options"] == {"color": "tortoisegoo9511", "size": "39x49in"}
    assert ('[SEP] asin [SEP] B09DG3YTHY [SEP] options [SEP] {"color": "tortoisegoo9511", '
            '"size": "39x49in"} [SEP]') in obs
    assert "Your score (min 0.0, max 1.0) [SEP] 1.0 [SEP]" in obs
    obs, reward, terminated, truncated, info = env.step("click[buy now]")
    assert not info["action_valid"] and "episode is over" in obs and reward == 0.0


@needs_data
def test_recorded_webshop_outcomes_are_reproduced():
    """Rewards that real WebShop runs reported for purchases of *other* products than the goal's.

    Goal 71 (screen protectors) bought B095PF5BXT without options: 1.0. Goal 5457 (women's
    jumpsuits) bought B09QGK5XHZ (a men's undershirt) without options: 0.03333333333333333
    = (2 of 6 attributes + 0 of 2 options + price) / 9 * 0.1 (title nouns barely overlap).
    """
    env = make(split="all")
    for task_id, asin, expected in [(71, "B095PF5BXT", 1.0),
                                    (5457, "B09QGK5XHZ", 0.03333333333333333)]:
        env.reset(options={"task_id": task_id})
        env.step(f"search[{title_of(env, asin)}]")
        _o, _r, _t, _tr, info = env.step(f"click[{asin.lower()}]")
        assert info["action_valid"], f"{asin} not on the first result page"
        _o, reward, terminated, _tr, info = env.step("click[buy now]")
        assert terminated and reward == pytest.approx(expected, abs=1e-12)


@needs_data
def test_pages_read_as_recorded_webshop_observations():
    """Page texts as real WebShop runs printed them (after the instruction, which carries a
    run-dependent price bound, see goals.py)."""
    env = make(split="all")
    obs, *_ = env.reset(options={"task_id": 490})
    obs, *_ = env.step("search[eco friendly fleece throw blanket tortoisegoo9511 39x49in under 60]")
    assert obs.split(" dollars [SEP] ", 1)[1].startswith(
        "Back to Search [SEP] Page 1 (Total results: 50) [SEP] Next > [SEP] B09DG3YTHY [SEP] "
        "Gogobebe Teal Green and Brown Flannel Fleece Throw Blanket for Sofa Couch Bed Retro Rustic "
        "Wood Grain Soft Cozy Lightweight Blanket for Adults/Kids 39x49inch [SEP] $31.39 [SEP] "
        "B0836D6CW4 [SEP] Sunbeam Heated Electric Fleece Throw Comforter Blanket with ")
    env.reset(options={"task_id": 71})
    env.step("search[tempered glass screen protector under $40]")
    obs, *_ = env.step("click[b095pf5bxt]")
    assert obs.split(" dollars [SEP] ", 1)[1] == (
        "Back to Search [SEP] < Prev [SEP] 【2+2 Pack】 for Samsung Galaxy A12 5G 【2pcs Screen "
        "Protector + 2pcs Camera Lens Protector】 Tempered Glass Film [0.3mm Thickness] [9H Hardness "
        "HD Clear] [Bubble Free] [Case Friendly] [Anti-Scratch] [Shatterproof ] [Anti-Fingerprint] "
        "[SEP] Price: $6.5 [SEP] Rating: N.A. [SEP] Description [SEP] Features [SEP] Reviews "
        "[SEP] Buy Now")


@needs_data
def test_step_limit_truncates_without_reward():
    env = make(split="test", max_steps=3)
    env.reset(options={"task_id": 7})
    results = [env.step("click[nothing]") for _ in range(3)]
    assert [r[3] for r in results] == [False, False, True]
    assert all(r[2] is False and r[1] == 0.0 for r in results)
    assert results[-1][4]["score"] == 0.0 and not results[-1][4]["success"]


@needs_data
def test_text_rich_mode_marks_buttons_and_chosen_options():
    env = make(split="test", observation_mode="text_rich")
    env.reset(options={"task_id": 490})
    env.step("search[eco friendly fleece throw blanket tortoisegoo9511 39x49in under 60]")
    env.step("click[b09dg3ythy]")
    obs, *_ = env.step("click[tortoisegoo9511]")
    assert obs.startswith("You have clicked tortoisegoo9511.\n")
    assert "[clicked button] tortoisegoo9511 [clicked button_]" in obs
    assert "[button] Buy Now [button_]" in obs


@needs_data
def test_search_anywhere_lets_search_run_from_item_pages():
    env = make(split="test", search_anywhere=True)
    env.reset(options={"task_id": 490})
    env.step("search[fleece blanket]")
    _o, _r, _t, _tr, info = env.step("search[screen protector]")
    assert info["action_valid"] and info["admissible_actions"][0] == "search[<query>]"


@needs_data
def test_attributes_sub_page_only_with_show_attributes():
    env = make(split="test", show_attributes=True)
    env.reset(options={"task_id": 490})
    env.step("search[fleece blanket]")
    _o, _r, _t, _tr, info = env.step("click[b09dg3ythy]")
    assert "attributes" in info["clickables"]
    obs, *_ = env.step("click[attributes]")
    assert "fleece throw" in obs
    plain = make(split="test")
    plain.reset(options={"task_id": 490})
    plain.step("search[fleece blanket]")
    assert "attributes" not in plain.step("click[b09dg3ythy]")[4]["clickables"]


def test_cli_lists_the_webshop_envs():
    out = subprocess.run([sys.executable, "-m", "crl_bench.cli", "list", "envs", "--family",
                          "webshop"], capture_output=True, text=True, check=True,
                         env={**os.environ})
    assert "crl/WebShop-v0" in out.stdout and "crl/WebShop-Human-v0" in out.stdout


@needs_data
def test_options_not_a_dict_is_a_type_error():
    env = make(split="test")
    with pytest.raises(TypeError, match="must be a dict"):
        env.reset(options="notadict")
    env.reset(options={"task_id": 0})


@needs_data
@pytest.mark.parametrize("action", ["click[\ud800]", "click[a\x1b[31mred\x1b[0m]", "\x00\x07",
                                    "click[" + "\ud83d" * 500 + "]"])
def test_invalid_actions_are_never_echoed_raw(action):
    env = make(split="test")
    env.reset(options={"task_id": 0})
    obs, reward, terminated, truncated, info = env.step(action)
    assert not info["action_valid"] and obs.startswith("Invalid action")
    obs.encode("utf-8")  # no lone surrogate
    assert not any(ord(c) < 32 and c not in "\n\t" for c in obs)
    assert len(obs.split("\n")[0]) < 500  # clipped (60 characters, each at most 6 escaped)


@needs_data
def test_steps_after_the_purchase_keep_the_episode_ended_with_a_reward_in_0_1():
    env = make(split="test")
    _obs, info = env.reset(options={"task_id": 490})
    env.step("search[tempered glass screen protector]")
    env.step("click[b083zk4nrs]")
    final = env.step("click[buy now]")
    assert final[2] is True and 0.0 <= final[1] <= 1.0
    for action in ("click[buy now]", "search[x]"):
        obs, reward, terminated, truncated, info = env.step(action)
        assert obs.startswith(final[0]) and "episode is over" in obs
        assert (reward, terminated, truncated, info["action_valid"]) == (0.0, True, False, False)
        assert info["score"] == final[4]["score"]
