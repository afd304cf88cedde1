import pytest

from handykit.roman import from_roman, to_roman


@pytest.mark.parametrize("n, numeral", [(1, "I"), (4, "IV"), (9, "IX"), (14, "XIV"),
                                        (40, "XL"), (1994, "MCMXCIV"), (3999, "MMMCMXCIX")])
def test_to_roman(n, numeral):
    assert to_roman(n) == numeral


@pytest.mark.parametrize("bad", [0, 4000, -3])
def test_to_roman_out_of_range(bad):
    with pytest.raises(ValueError):
        to_roman(bad)


def test_to_roman_type():
    with pytest.raises(TypeError):
        to_roman(2.5)


@pytest.mark.parametrize("numeral, n", [("III", 3), ("VIII", 8), ("mdclxvi", 1666)])
def test_from_roman_additive(numeral, n):
    assert from_roman(numeral) == n


@pytest.mark.parametrize("bad", ["", "IIII", "ABC", "VV"])
def test_from_roman_rejects_invalid(bad):
    with pytest.raises(ValueError):
        from_roman(bad)
