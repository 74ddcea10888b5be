import math

import pytest

from memfit.sizes import format_count, format_size, parse_size, plural


@pytest.mark.parametrize("text,expected", [
    ("512MiB", 512 * 2**20), ("2GB", 2 * 10**9), ("1.5G", int(1.5 * 2**30)),
    ("4096", 4096), ("10k", 10 * 1024), ("3 KiB", 3 * 1024), ("1mb", 10**6),
    ("0.5TiB", 2**39), (".5M", 2**19), ("7B", 7), (123, 123), (1.9, 1),
])
def test_parse_size_units(text, expected):
    assert parse_size(text) == expected


@pytest.mark.parametrize("bad", ["", "MiB", "12XB", "-5", "1.2.3G", "iB", "five", None, True,
                                 -1, math.inf, [1]])
def test_parse_size_rejects_and_quotes_the_value(bad):
    with pytest.raises(ValueError) as e:
        parse_size(bad, name="memory_budget")
    assert "memory_budget" in str(e.value)
    assert repr(bad) in str(e.value) or str(bad) in str(e.value)


@pytest.mark.parametrize("n,text", [(0, "0 B"), (1023, "1023 B"), (1536, "1.5 KiB"),
                                    (3 * 2**20, "3.0 MiB"), (2**30 * 2.5, "2.5 GiB"),
                                    (None, "n/a"), (-2**20, "-1.0 MiB")])
def test_format_size(n, text):
    assert format_size(n) == text


def test_format_then_parse_round_trips():
    for n in (2**20, 5 * 2**30, 1536):
        assert parse_size(format_size(n).replace(" ", "")) == n
    assert format_size(2**20, signed=True) == "+1.0 MiB"


@pytest.mark.parametrize("n,noun,many,text", [
    (1, "shard", None, "1 shard"), (0, "shard", None, "0 shards"),
    (4096, "sample", None, "4,096 samples"), (1, "batch", "batches", "1 batch"),
    (2, "batch", "batches", "2 batches"), (1, "process", "processes", "1 process")])
def test_format_count_says_one_thing_and_many_things(n, noun, many, text):
    assert format_count(n, noun, many) == text
    assert plural(n, noun, many) == text.split(" ", 1)[1]


@pytest.mark.parametrize("text", ["10", " 512 ", "0.5", "1048575"])
def test_a_memory_size_without_a_unit_below_a_mib_is_refused_as_a_unit_left_out(text):
    """A stranger's `--budget 10` was 10 bytes: "nothing fits", after a child had run."""
    with pytest.raises(ValueError, match=rf"without a unit is a number of bytes: "
                                         rf"{text.strip()} is .*Received: budget='{text}'"):
        parse_size(text, name="budget", memory=True)
    assert parse_size(text, name="size") == int(float(text))     # other sizes: bytes


def test_a_memory_size_with_a_unit_or_from_python_or_zero_is_taken_as_it_says():
    assert parse_size("10B", memory=True) == 10 and parse_size(10, memory=True) == 10
    assert parse_size("1048576", memory=True) == 2**20 and parse_size("0", memory=True) == 0
    assert parse_size("10GiB", memory=True) == 10 * 2**30
