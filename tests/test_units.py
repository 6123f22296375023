import pytest

from perfkit import units
from perfkit.errors import UserError


def test_convert_within_a_dimension():
    assert units.convert([1.5, 0.2], "s", "ms") == pytest.approx([1500.0, 200.0])
    assert units.factor("GiB", "MiB") == 1024
    assert units.factor("%", "fraction") == pytest.approx(0.01)


def test_convert_across_dimensions_is_refused():
    with pytest.raises(UserError, match="cannot convert ms"):
        units.factor("ms", "B")
    with pytest.raises(UserError, match="unknown unit 'msec'"):
        units.dimension("msec")


@pytest.mark.parametrize(
    "value, digits, text",
    [
        (0.18, 3, "0.18"),
        (1111.1, 2, "1,100"),
        (46000, 3, "46,000"),
        (99.96, 3, "100"),
        (-3.14159, 3, "-3.14"),
        (0.000123, 2, "0.00012"),
        (0, 3, "0"),
        (float("nan"), 3, "nan"),
    ],
)
def test_format_number(value, digits, text):
    assert units.format_number(value, digits) == text


def test_format_quantity_and_factor():
    assert units.format_quantity(0.18, "ms") == "0.18 ms"
    assert units.format_quantity(75, "%") == "75%"
    assert units.format_factor(200 / 0.18) == "1,100x"
