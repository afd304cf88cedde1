"""A plugin agent, registered under the entry-point name ``echo_agent``: Complementary RL
without Search-and-Ask and without merging, composed from crl-bench's own parts."""

from crl_bench.agent_spec import AgentSpec

EchoAgent = AgentSpec(name="echo_agent", description="plugin example agent", merge=False, search_ask=False)
