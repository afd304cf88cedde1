"""crl-bench: Complementary RL for LLM agents as a Gymnasium-style benchmark suite.

Importing the package registers the built-in text envs with gymnasium under the ``crl/``
namespace (lazily: no env dependency is imported until an env is made), so
``gymnasium.make("crl/MiniHack-Room-5x5-v0")`` works after ``import crl_bench``.
"""

from __future__ import annotations

import importlib.util

__version__ = "0.1.0"

__all__ = ["AGENTS", "ENVS", "MIXES", "INFO_KEYS", "EnvEntry", "Registry", "TextEnv", "TextSpace",
           "make_env", "register_env", "__version__"]


def _register_builtins() -> None:
    from crl_bench.baselines import register_builtin_agents
    from crl_bench.envs import register_builtin_envs
    from crl_bench.mixes import register_builtin_mixes

    register_builtin_envs()
    register_builtin_mixes()
    register_builtin_agents()


from crl_bench.builds import register_builtin_builds  # noqa: E402

register_builtin_builds()

# Without gymnasium (a GPU image with torch and transformers only, for benchmarks/gpu_check.py)
# the learner, trainer and model modules import, and the env side is absent.
if importlib.util.find_spec("gymnasium") is not None:
    from crl_bench.registry import AGENTS, ENVS, MIXES, EnvEntry, Registry, make_env, register_env
    from crl_bench.text_env import INFO_KEYS, TextEnv, TextSpace

    _register_builtins()
