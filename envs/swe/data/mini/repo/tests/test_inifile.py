import pytest

from handykit.inifile import IniError, parse_ini

SAMPLE = """
# global settings
name = demo

[server]
Host = example.org
port: 8080
; a comment

[empty]
"""


def test_parse_sections_and_default():
    assert parse_ini(SAMPLE) == {
        "DEFAULT": {"name": "demo"},
        "server": {"host": "example.org", "port": "8080"},
        "empty": {},
    }


def test_last_value_wins():
    assert parse_ini("[a]\nx = 1\nx = 2\n") == {"a": {"x": "2"}}


def test_bad_line_reports_line_number():
    with pytest.raises(IniError) as err:
        parse_ini("[a]\nx = 1\njust words\n")
    assert err.value.lineno == 3


def test_bad_section_header():
    with pytest.raises(IniError):
        parse_ini("[unclosed\n")
