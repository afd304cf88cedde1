from handykit.graph import reachable, topological_sort


def test_topological_sort_respects_dependencies():
    graph = {"app": ["lib", "log"], "lib": ["log"], "tests": ["app"]}
    order = topological_sort(graph)
    assert order == ["log", "lib", "app", "tests"]


def test_topological_sort_independent_nodes_sorted():
    assert topological_sort({"b": [], "a": [], "c": []}) == ["a", "b", "c"]


def test_nodes_only_mentioned_as_dependencies_are_included():
    assert topological_sort({"x": ["y"]}) == ["y", "x"]


def test_reachable():
    graph = {"a": ["b"], "b": ["c"], "c": [], "d": ["a"]}
    assert reachable(graph, "a") == {"a", "b", "c"}
    assert reachable(graph, "c") == {"c"}
