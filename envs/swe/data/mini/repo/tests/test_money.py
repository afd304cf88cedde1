from decimal import Decimal

from handykit.money import from_cents, round_money, split_amount, to_cents


def test_round_half_up():
    assert round_money("2.675") == Decimal("2.68")
    assert round_money("2.665") == Decimal("2.67")
    assert round_money(3) == Decimal("3.00")


def test_cents_round_trip():
    assert to_cents("12.34") == 1234
    assert from_cents(1234) == Decimal("12.34")


def test_split_even():
    assert split_amount("9.00", 3) == [Decimal("3.00")] * 3


def test_split_into_one():
    assert split_amount("5.55", 1) == [Decimal("5.55")]
