import pytest

from handykit.text import camel_case, slugify, snake_case, truncate, wrap


def test_slugify_simple_words():
    assert slugify("Hello World") == "hello-world"


def test_slugify_strips_accents():
    assert slugify("Café Crème") == "cafe-creme"


def test_slugify_custom_separator():
    assert slugify("make it snappy", sep="_") == "make_it_snappy"


def test_truncate_keeps_short_text():
    assert truncate("short", 10) == "short"
    assert truncate("exact", 5) == "exact"


def test_truncate_rejects_width_below_ellipsis():
    with pytest.raises(ValueError):
        truncate("anything", 2)


def test_snake_case_from_camel():
    assert snake_case("camelCase") == "camel_case"
    assert snake_case("CamelCase") == "camel_case"


def test_snake_case_from_kebab_and_spaces():
    assert snake_case("kebab-case name") == "kebab_case_name"


def test_camel_case():
    assert camel_case("http_server") == "HttpServer"
    assert camel_case("make-it snappy", upper_first=False) == "makeItSnappy"
    assert camel_case("") == ""


def test_wrap_greedy():
    assert wrap("the quick brown fox jumps", 10) == ["the quick", "brown fox", "jumps"]


def test_wrap_long_word_gets_own_line():
    assert wrap("a supercalifragilistic word", 5) == ["a", "supercalifragilistic", "word"]
