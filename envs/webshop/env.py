"""``WebShopTextEnv``: WebShop as a crl-bench text env (``crl/WebShop-v0``).

Actions are WebShop's: ``search[keywords]`` on a page with a search box, ``click[element]`` for a
clickable element (an ASIN, an option value, "Buy Now", "< Prev", ...; matched lower-cased).
Observations are WebShop's ``text`` mode (visible page text joined by ``" [SEP] "``), or its
``text_rich`` mode (``[button] ... [button_]`` markers, chosen options and visited products shown
as ``[clicked button]``). An episode ends when the agent buys (``terminated``) or after
``max_steps`` actions (``truncated``, reward 0).

``info`` (besides the contract keys):

* ``admissible_actions`` - ``click[<label>]`` for each clickable element of the page, plus the
  literal entry ``search[<query>]`` when the page has a search box (replace ``<query>`` with
  your keywords; any keywords are valid there);
* ``search_available`` (bool), ``clickables`` (lower-cased labels), ``page`` (search / results /
  item / sub_page / done);
* after a purchase: ``webshop_reward`` (WebShop's raw value) and ``reward_breakdown``.

The step reward is WebShop's reward, given at the purchase, in [0, 1] (each goal option counts at
most once, as in WebShop); ``score`` is the same value and ``success`` is ``score == 1.0``. Note
that WebShop's reward is below 1.0 for some goals even when the goal's product is bought exactly
as asked (458 of the 6,910 synthetic goals, see ``experiments/webshop_oracle_ceiling.py``).

Invalid actions (unknown element, malformed brackets, empty search, searching on a page without
a search box) change nothing; the observation says why (quoting the action through
:func:`crl_bench.text_env.echo_text`: escaped and clipped) and then repeats the page. After the
purchase or the step cap, further steps follow the text-env convention
(:mod:`crl_bench.text_env`): the final page again, reward 0, the same end flags,
``action_valid=False``. WebShop's own text env also lets ``search[...]`` run on any page; set
``search_anywhere=True`` for that.
"""

from __future__ import annotations

from typing import Any

from crl_bench.envs.webshop.data import WebShopData, load_webshop_data
from crl_bench.envs.webshop.engine import DONE, Outcome, ShopSession, clip_text
from crl_bench.envs.webshop.goals import GOAL_SOURCES, SPLITS, WebShopGoal, split_indices
from crl_bench.text_env import TextEnv, coerce_action, reset_options, safe_text

SEARCH_PLACEHOLDER = "search[<query>]"
OBSERVATION_MODES: tuple[str, ...] = ("text", "text_rich")
SEP = " [SEP] "


def parse_action(action: str) -> tuple[str, str] | None:
    """``"click[Buy Now]"`` -> ``("click", "Buy Now")``; ``None`` when not ``name[argument]``.

    The name is matched case-insensitively and surrounding spaces are ignored; the argument is
    everything between the first ``[`` and the last ``]``.
    """
    text = action.strip()
    open_at, close_at = text.find("["), text.rfind("]")
    if open_at <= 0 or close_at != len(text) - 1 or close_at < open_at:
        return None
    return text[:open_at].strip().lower(), text[open_at + 1:close_at].strip()


class WebShopTextEnv(TextEnv):
    """WebShop (1,000-product catalogue by default) with WebShop's pages, actions and reward.

    Args:
        split: goals to draw from: "train" (goal index 1500+), "dev"/"eval" (500-1499), "test"
            (0-499) or "all" - WebShop's split, see :mod:`crl_bench.envs.webshop.goals`.
        data_dir: the WebShop data folder; default: ``$CRL_BENCH_WEBSHOP_DATA``,
            ``$CRL_BENCH_DATA/webshop`` or the cache (see :mod:`crl_bench.data`).
        max_steps: actions per episode (the paper uses 10-15).
        goal_source: "synthetic" (WebShop's generated instructions) or "human".
        catalogue: "1k" (1,000 products) or "full" (1.18M, after downloading it).
        observation_mode: "text" or "text_rich".
        show_attributes: offer WebShop's hidden "Attributes" sub-page on item pages.
        search_anywhere: accept ``search[...]`` on every page, as WebShop's own text env does.
    """

    family = "webshop"

    def __init__(self, split: str = "train", data_dir: str | None = None, max_steps: int = 15,
                 goal_source: str = "synthetic", catalogue: str = "1k",
                 observation_mode: str = "text", show_attributes: bool = False,
                 search_anywhere: bool = False, render_mode: str | None = None) -> None:
        super().__init__(max_steps=max_steps, render_mode=render_mode)
        if split not in SPLITS:
            raise ValueError(f"split {split!r} is unknown; use one of {sorted(SPLITS)}.")
        if goal_source not in GOAL_SOURCES:
            raise ValueError(f"goal_source {goal_source!r} is unknown; use one of {GOAL_SOURCES}.")
        if observation_mode not in OBSERVATION_MODES:
            raise ValueError(f"observation_mode {observation_mode!r} is unknown; use one of "
                             f"{OBSERVATION_MODES}.")
        self.split = split
        self.goal_source = goal_source
        self.observation_mode = observation_mode
        self.show_attributes = bool(show_attributes)
        self.search_anywhere = bool(search_anywhere)
        self.data: WebShopData = load_webshop_data(data_dir, catalogue, goal_source)
        self.goals: list[WebShopGoal] = self.data.goals(goal_source)
        self.prices = self.data.prices(goal_source)
        self.split_goals = split_indices(split, len(self.goals))
        if len(self.split_goals) == 0:
            raise ValueError(
                f"split {split!r} has no {goal_source} goals: the {catalogue} catalogue has "
                f"{len(self.goals)}, and {split!r} starts at goal {SPLITS[split][0]}. Use "
                f"split='all' (or 'test') for this goal source.")
        self.search_engine = self.data.search  # build or load the index now, not mid-episode
        self.session: ShopSession | None = None
        self.goal: WebShopGoal | None = None
        self._steps = 0
        self._finished = False

    # -- tasks ---------------------------------------------------------------------------------
    def task_ids(self) -> list[str]:
        """The task ids of this env's split (goal indices as strings)."""
        return [str(i) for i in self.split_goals]

    def _goal_for(self, task_id: Any) -> WebShopGoal:
        try:
            index = int(str(task_id).strip())
        except ValueError:
            index = -1
        if not 0 <= index < len(self.goals):
            raise ValueError(f"task_id {task_id!r} is not a goal index of the {self.goal_source} "
                             f"goals (0..{len(self.goals) - 1}); env.unwrapped.task_ids() lists "
                             f"the {self.split!r} split.")
        return self.goals[index]

    # -- gymnasium API ---------------------------------------------------------------------------
    def reset(self, *, seed: int | None = None,
              options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        options = reset_options(options)
        super().reset(seed=seed)
        self.start_episode()
        task_id = options.get("task_id")
        if task_id is None:
            pick = int(self.np_random.integers(len(self.split_goals)))
            self.goal = self.goals[self.split_goals[pick]]
        else:
            self.goal = self._goal_for(task_id)
        self.session = ShopSession(goal=self.goal, by_asin=self.data.by_asin, prices=self.prices,
                                   search=self.search_engine.search,
                                   show_attributes=self.show_attributes)
        self._steps = 0
        self._finished = False
        obs = safe_text(self._render_page())
        self._last_observation = obs
        return obs, self._info(Outcome(True))

    def step(self, action: Any) -> tuple[str, float, bool, bool, dict[str, Any]]:
        if self.session is None:
            raise RuntimeError("Call reset() before step().")
        text = coerce_action(action)
        after_end = self.step_after_end()
        if after_end is not None:
            return after_end
        self._steps += 1
        outcome = self._act(text)
        terminated = outcome.done
        truncated = not terminated and self._steps >= self.max_steps
        if terminated or truncated:
            self._finished = True
        obs = self._render_page()
        if not outcome.valid:
            obs = f"Invalid action ({outcome.message}).\n{obs}"
        reward = min(1.0, max(0.0, float(outcome.reward)))
        return self.finish_step(obs, reward, terminated, truncated, self._info(outcome))

    def _act(self, text: str) -> Outcome:
        assert self.session is not None
        parsed = parse_action(text)
        if parsed is None:
            return Outcome(False, f"'{clip_text(text)}' is not search[keywords] or click[element]")
        name, argument = parsed
        if name == "search":
            if not (self.session.has_search_bar or self.search_anywhere):
                return Outcome(False, "this page has no search box; click[back to search] first")
            if not argument:
                return Outcome(False, "search needs keywords, e.g. search[red running shoes]")
            return self.session.do_search(argument)
        if name == "click":
            if not argument:
                return Outcome(False, "click needs an element, e.g. click[buy now]")
            return self.session.do_click(argument)
        return Outcome(False, f"unknown action '{clip_text(name)}'; use search[...] or click[...]")

    # -- observation and info --------------------------------------------------------------------
    def _render_page(self) -> str:
        assert self.session is not None
        segments = self.session.segments()
        if self.observation_mode == "text":
            obs = SEP.join(s.text for s in segments)
        else:
            lines: list[str] = []
            clicked: list[str] = []
            for s in segments:
                if s.role == "button":
                    lines.append(f"[button] {s.text} [button_]")
                elif s.role == "option":
                    if s.selected:
                        clicked.append(f"You have clicked {s.text}.")
                        lines.append(f"  [clicked button] {s.text} [clicked button_]")
                    else:
                        lines.append(f"  [button] {s.text} [button_]")
                elif s.role == "product":
                    mark = "clicked button" if s.selected else "button"
                    lines.append(f"\n[{mark}] {s.text} [{mark}_]")
                else:
                    lines.append(s.text)
            obs = "".join(f"{c}\n" for c in clicked) + "".join(f"{line}\n" for line in lines)
        self._last_observation = obs
        return obs

    def admissible_actions(self) -> list[str]:
        assert self.session is not None
        if self._finished:
            return []
        actions = [f"click[{label}]" for label in self.session.clickables()]
        if self.session.has_search_bar or self.search_anywhere:
            actions.insert(0, SEARCH_PLACEHOLDER)
        return actions

    def _info(self, outcome: Outcome) -> dict[str, Any]:
        assert self.session is not None and self.goal is not None
        raw = self.session.reward if self.session.page == DONE else 0.0
        score = min(1.0, max(0.0, raw))
        extra: dict[str, Any] = {
            "page": self.session.page,
            "search_available": (self.session.has_search_bar or self.search_anywhere)
                                and not self._finished,
            "clickables": [] if self._finished else list(self.session.clickables()),
            "steps": self._steps,
        }
        if self.session.page == DONE and self.session.breakdown is not None:
            extra["webshop_reward"] = raw
            extra["reward_breakdown"] = self.session.breakdown.as_dict()
            extra["purchased_asin"] = self.session.asin
            extra["purchased_options"] = dict(self.session.options)
        return self.make_info(goal=self.goal.instruction_text,
                              admissible_actions=self.admissible_actions(),
                              success=score == 1.0, score=score, action_valid=outcome.valid,
                              task_id=str(self.goal.index), **extra)
