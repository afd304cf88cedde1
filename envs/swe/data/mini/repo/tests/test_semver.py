import pytest

from handykit.semver import Version


def test_parse_and_str_round_trip():
    for text in ["1.2.3", "0.0.1", "1.0.0-alpha.1", "2.1.0+build.5", "1.0.0-rc.1+sha.abc"]:
        assert str(Version.parse(text)) == text


def test_parse_fields():
    v = Version.parse("1.0.0-beta.2+exp")
    assert (v.major, v.minor, v.patch) == (1, 0, 0)
    assert v.prerelease == ("beta", "2")
    assert v.build == ("exp",)


@pytest.mark.parametrize("bad", ["1.2", "01.2.3", "1.2.3-", "v1.2.3", ""])
def test_parse_rejects(bad):
    with pytest.raises(ValueError):
        Version.parse(bad)


def test_release_ordering_is_numeric():
    assert Version.parse("1.9.0") < Version.parse("1.10.0")
    assert Version.parse("2.0.0") > Version.parse("1.99.99")


def test_build_metadata_is_ignored_in_comparisons():
    assert Version.parse("1.0.0+a") == Version.parse("1.0.0+b")


def test_bump_major_and_patch():
    assert str(Version.parse("1.2.3-rc.1").bump("major")) == "2.0.0"
    assert str(Version.parse("1.2.3").bump("patch")) == "1.2.4"


def test_bump_rejects_unknown_part():
    with pytest.raises(ValueError):
        Version.parse("1.2.3").bump("micro")
