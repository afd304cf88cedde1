"""A plugin agent: registered under the entry-point name ``echo_agent``."""


class EchoAgent:
    """Not a learner: shows that third-party agents are discovered by registration."""

    description = "plugin example agent"
