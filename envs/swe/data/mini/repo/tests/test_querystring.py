from handykit.querystring import encode_qs, parse_qs


def test_parse_simple():
    assert parse_qs("a=1&b=2") == {"a": ["1"], "b": ["2"]}


def test_parse_leading_question_mark_and_empty_pairs():
    assert parse_qs("?a=1&&b=2&") == {"a": ["1"], "b": ["2"]}


def test_parse_repeated_keys():
    assert parse_qs("tag=x&tag=y") == {"tag": ["x", "y"]}


def test_parse_percent_escapes():
    assert parse_qs("name=J%C3%BCrgen%20M&x=%26") == {"name": ["Jürgen M"], "x": ["&"]}


def test_blank_values():
    assert parse_qs("a=&b=1") == {"b": ["1"]}
    assert parse_qs("a=&b=1", keep_blank=True) == {"a": [""], "b": ["1"]}


def test_encode():
    assert encode_qs({"a": "1", "tag": ["x", "y"]}) == "a=1&tag=x&tag=y"
