"""What an agent is: a config dataclass and one training step, written as code.

An agent says which parts a run must build (:meth:`Agent.build`) and what one training step does
with them (:meth:`Agent.train_step`): plan task groups, play, compute advantages, update, hand
trajectories to the extractor. The loop around it (:mod:`crl_bench.run.loop`) only calls the
step, evaluates, logs and checkpoints. The built-in agents live in ``baselines/``
(``crl_bench.baselines``): read ``grpo.py`` first, then ``comp_rl.py``.

A new agent is a subclass (or an instance with other options) registered by name::

    # my_pkg/agent.py
    from dataclasses import dataclass
    from crl_bench.agent import Agent

    @dataclass
    class MyConfig:
        temperature_bonus: float = 0.0
        \"\"\"What it does (one docstring per field: ``crl-bench list agents -v`` shows them).\"\"\"

    class MyAgent(Agent):
        Config = MyConfig
        def build(self, ctx): ctx.build_models(extractor=False); ctx.build_actor_trainer()
        def train_step(self, ctx, step): ...

An agent that builds an extractor too says so: ``roles`` returns ``("actor", "extractor")``
(and ``shares_parameters`` True when one model serves both); generic code (validation, for one)
asks these, never the agent's name.

    AGENT = MyAgent("my_agent", label="My agent", description="...")

and in the plugin's ``pyproject.toml``::

    [project.entry-points."crl_bench.agents"]
    my_agent = "my_pkg.agent:AGENT"

Options are set per run with ``--set method.FIELD=VALUE``; an unknown field is refused with the
list of known ones.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

if TYPE_CHECKING:  # pragma: no cover
    from crl_bench.run.context import RunContext


@dataclass
class NoOptions:
    """An agent without options."""


@dataclass
class StepResult:
    """What one training step hands back to the loop.

    Attributes:
        trajectories: every training episode played in the step (the loop records them).
        metrics: namespaced scalars for ``metrics.jsonl`` (``losses/``, ``charts/``, ...).
    """

    trajectories: list[Any]
    metrics: dict[str, Any] = field(default_factory=dict)


class Agent:
    """Base class of every agent (built-in and plugin).

    Subclasses set :attr:`Config` (a dataclass whose fields are the agent's options) and implement
    :meth:`build` and :meth:`train_step`. An instance is one configured agent; variants (the
    ablations) are instances with other options, made with :meth:`variant`.

    Args:
        name: the registry name (``--agent NAME``).
        label: the row name in tables and plots ("Comp. RL").
        description: one line for ``crl-bench list agents``.
        config: the options (an instance of ``Config``; default: ``Config()``).
    """

    Config: ClassVar[type] = NoOptions

    def __init__(self, name: str, *, label: str = "", description: str = "",
                 config: Any = None) -> None:
        self.name = name
        self.label = label or name
        self.description = description
        self.config = config if config is not None else self.Config()
        if not isinstance(self.config, self.Config):
            raise TypeError(f"agent {name!r}: config must be a {self.Config.__name__}, "
                            f"got {type(self.config).__name__}")

    # -- variants and options --------------------------------------------------------------------
    def variant(self, name: str, *, label: str = "", description: str = "", **options: Any) -> "Agent":
        """A copy with other options: ``AGENT.variant("comp_rl_no_merge", merge=False)``."""
        return type(self)(name, label=label or name, description=description or self.description,
                          config=dataclasses.replace(self.config, **options))

    def with_options(self, options: dict[str, Any] | None) -> "Agent":
        """This agent with ``--set method.FIELD=VALUE`` options applied (checked by name and type).

        Raises:
            ValueError: an option this agent does not have, or a value of the wrong type.
        """
        if not options:
            return self
        known = {f.name: f for f in dataclasses.fields(self.config)}
        for key, value in options.items():
            if key not in known:
                names = ", ".join(sorted(known)) or "(none)"
                raise ValueError(f"method.{key}: agent {self.name!r} has no option {key!r}; its "
                                 f"options are: {names}.")
            current = getattr(self.config, key)
            if isinstance(current, bool) and not isinstance(value, bool):
                raise ValueError(f"method.{key} must be true or false, got {value!r}.")
            if isinstance(current, (int, float)) and not isinstance(current, bool) and (
                    isinstance(value, bool) or not isinstance(value, (int, float))):
                raise ValueError(f"method.{key} must be a number, got {value!r}.")
            if isinstance(current, str) and not isinstance(value, str):
                raise ValueError(f"method.{key} must be a string, got {value!r}.")
        agent = type(self)(self.name, label=self.label, description=self.description,
                           config=dataclasses.replace(self.config, **options))
        agent.check_options()
        return agent

    def check_options(self) -> None:
        """Reject option values that cannot work (raise ``ValueError`` naming ``method.FIELD``)."""

    def options(self) -> dict[str, Any]:
        return dataclasses.asdict(self.config)

    def option_docs(self) -> list[tuple[str, Any, str]]:
        """``(name, value, docstring)`` of every option (``crl-bench list agents -v``): the
        docstring under each field of :attr:`Config`, read from its source."""
        docs = field_docstrings(self.Config)
        return [(f.name, getattr(self.config, f.name), docs.get(f.name, ""))
                for f in dataclasses.fields(self.config)]

    # -- what the run needs ----------------------------------------------------------------------
    @property
    def roles(self) -> tuple[str, ...]:
        """The roles the agent builds a model for: ``("actor",)``, or ``("actor", "extractor")``
        for an agent with an experience extractor. Generic code asks the agent this (never its
        name): full fine-tuning on one vLLM base, for one, needs a set of weights per role."""
        return ("actor",)

    @property
    def shares_parameters(self) -> bool:
        """Whether all its roles run on one set of parameters (one model serves every role)."""
        return False

    @property
    def uses_bank(self) -> bool:
        """Whether the agent keeps an experience bank (evaluation then runs with and without it)."""
        return False

    @property
    def split_groups(self) -> bool:
        """Whether each group is split into with/without-experience halves (K must be even, >= 4)."""
        return False

    def build(self, ctx: "RunContext") -> None:
        """Ask ``ctx`` for the parts the agent uses (trainers, the bank, the extractor)."""
        raise NotImplementedError

    def train_step(self, ctx: "RunContext", step: int) -> StepResult:
        """One actor step (``step`` counts from 1)."""
        raise NotImplementedError

    # -- the agent's own state -------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """State the agent keeps across steps (a running baseline, a schedule, a buffer), saved
        in every checkpoint beside the parts' and given back to :meth:`load_state_dict` on
        ``--resume``. Plain data and tensors (it is written with ``torch.save``); default: none."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned (``{}`` from a checkpoint without it)."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r}, {self.config})"


def field_docstrings(cls: type) -> dict[str, str]:
    """The string literal under each annotated field of a class's source (PEP 257's attribute
    docstrings), joined into one line; {} when the source cannot be read."""
    import ast
    import inspect
    import textwrap

    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    except (OSError, TypeError, SyntaxError):
        return {}
    body = tree.body[0].body if tree.body and isinstance(tree.body[0], ast.ClassDef) else []
    docs: dict[str, str] = {}
    for node, nxt in zip(body, body[1:]):
        if (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)
                and isinstance(nxt, ast.Expr) and isinstance(nxt.value, ast.Constant)
                and isinstance(nxt.value.value, str)):
            docs[node.target.id] = " ".join(nxt.value.value.split())
    return docs


def agent_label(name: str) -> str:
    """The table label of a registered agent, the agent object's own :attr:`Agent.label` (its
    name when it is not registered, or cannot be loaded)."""
    from crl_bench.registry import AGENTS, PluginError, RegistryError

    try:
        agent = AGENTS.get(name)
    except (RegistryError, PluginError):
        return name
    return getattr(agent, "label", "") or name


def agent_description(name: str) -> str:
    """The one-line description of a registered agent, read from the agent object ("" when it
    has none)."""
    from crl_bench.registry import AGENTS

    return getattr(AGENTS.get(name), "description", "") or ""


def load_agent(name: str, options: dict[str, Any] | None = None) -> Agent:
    """The registered agent ``name`` with ``options`` applied.

    Raises:
        RegistryError: unknown name (the message lists the known ones).
        PluginError: the plugin that provides it failed to import (every time it is asked for).
        TypeError: the registered object is not an :class:`Agent`.
    """
    from crl_bench.registry import AGENTS

    agent = AGENTS.get(name)
    if not isinstance(agent, Agent):
        raise TypeError(f"agent {name!r} must be a crl_bench.agent.Agent instance, got "
                        f"{type(agent).__name__}; see `crl_bench/agent.py` for how to write one.")
    if agent.name != name:  # registered under another name than the instance's own
        agent = type(agent)(name, label=agent.label, description=agent.description, config=agent.config)
    return agent.with_options(options)
