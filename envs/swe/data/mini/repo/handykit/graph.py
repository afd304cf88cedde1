"""Directed graphs given as ``{node: [nodes it depends on]}`` mappings."""

from collections import deque

__all__ = ["CycleError", "topological_sort", "reachable"]


class CycleError(ValueError):
    """The graph has a cycle; ``nodes`` are the nodes that could not be ordered."""

    def __init__(self, nodes):
        self.nodes = sorted(nodes, key=repr)
        super().__init__(f"dependency cycle among: {', '.join(map(str, self.nodes))}")


def _all_nodes(graph):
    nodes = set(graph)
    for deps in graph.values():
        nodes.update(deps)
    return nodes


def topological_sort(graph):
    """Order the nodes so that every node comes after the nodes it depends on.

    Ties are broken by sorting, so the result is deterministic.

    >>> topological_sort({"app": ["lib", "log"], "lib": ["log"]})
    ['log', 'lib', 'app']

    Raises:
        CycleError: some nodes depend on each other in a cycle.
    """
    nodes = _all_nodes(graph)
    pending = {n: set(graph.get(n, ())) for n in nodes}
    users = {n: set() for n in nodes}
    for node, deps in pending.items():
        for dep in deps:
            users[dep].add(node)
    ready = sorted((n for n, deps in pending.items() if not deps), key=repr)
    order = []
    while ready:
        node = ready.pop(0)
        order.append(node)
        for user in sorted(users[node], key=repr):
            pending[user].discard(node)
            if not pending[user]:
                ready.append(user)
        ready.sort(key=repr)
    if len(order) != len(nodes):
        raise CycleError(n for n in nodes if pending[n])
    return order


def reachable(graph, start):
    """Every node reachable from ``start`` by following dependencies (``start`` included)."""
    seen = {start}
    queue = deque([start])
    while queue:
        for dep in graph.get(queue.popleft(), ()):
            if dep not in seen:
                seen.add(dep)
                queue.append(dep)
    return seen
