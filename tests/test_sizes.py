"""Sizes: one parser for every size a user writes (the cache's cap, the trace ceiling, the
gate's memory budget), one formatter for every memory size printed; units as documented in
advisor/sizes.py and the README: K/M/G/T and KiB..TiB binary, KB..TB decimal."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from advisor.sizes import format_bytes, parse_size


@pytest.mark.parametrize(
    "text, expected",
    [
        ("1024", 1024),
        ("512B", 512),
        ("2G", 2 * 1024**3),
        ("2 GiB", 2 * 1024**3),
        ("2g", 2 * 1024**3),
        ("1.5GiB", 3 * 1024**3 // 2),
        ("1.5 KiB", 1536),
        ("500M", 500 * 1024**2),
        ("500MB", 500 * 1000**2),
        ("800 mb", 800 * 1000**2),
        ("3 TB", 3 * 1000**4),
        ("3T", 3 * 1024**4),
        (" 16 GiB ", 16 * 1024**3),
        ("0", 0),
        (1024, 1024),
        (2.5e9, 2_500_000_000),
    ],
)
def test_sizes_read_binary_letters_and_decimal_si_names(text, expected):
    assert parse_size(text) == expected


@pytest.mark.parametrize("bad", ["12 parsecs", "lots", "", "GiB", "-1G", "1e9", "2 GiBs", "1,5G", True, -1, float("inf"), float("nan"), None, [1], "9" * 30])
def test_a_bad_size_is_refused_in_one_line_naming_it(bad):
    with pytest.raises(ValueError) as info:
        parse_size(bad)
    message = str(info.value)
    assert "\n" not in message and repr(bad)[:20] in message


def test_every_size_setting_reads_the_same_units(monkeypatch):
    from advisor.cache import max_cache_bytes
    from advisor.load.decode import max_trace_bytes

    monkeypatch.setenv("ADVISOR_CACHE_MAX_BYTES", "500MB")
    monkeypatch.setenv("ADVISOR_MAX_TRACE_BYTES", "500MB")
    assert max_cache_bytes() == max_trace_bytes() == 500 * 1000**2
    monkeypatch.setenv("ADVISOR_CACHE_MAX_BYTES", "1.5G")
    monkeypatch.setenv("ADVISOR_MAX_TRACE_BYTES", "1.5G")
    assert max_cache_bytes() == max_trace_bytes() == 3 * 1024**3 // 2
    # an unreadable cap: the cache keeps its default (it never fails a report) ...
    monkeypatch.setenv("ADVISOR_CACHE_MAX_BYTES", "lots")
    assert max_cache_bytes() == 2 * 1024**3
    # ... the trace ceiling is refused, one line naming the variable
    from advisor.errors import InputError

    monkeypatch.setenv("ADVISOR_MAX_TRACE_BYTES", "0")
    with pytest.raises(InputError, match=r"^ADVISOR_MAX_TRACE_BYTES='0': expected a size in bytes"):
        max_trace_bytes()


@pytest.mark.parametrize(
    "n, text",
    [
        (0, "0 B"),
        (1023, "1023 B"),
        (1536, "1.5 KiB"),
        (85_017_493_504, "79.2 GiB"),  # an H100's memory: 79.2 GiB, not 85.0
        (-3 * 1024**2, "-3.0 MiB"),
        (5 * 1024**4, "5.0 TiB"),
        (None, "n/a"),
        (float("nan"), "n/a"),
    ],
)
def test_memory_sizes_print_in_binary_units(n, text):
    assert format_bytes(n) == text


@settings(deadline=None)  # no time limit per example: a busy machine may pause the test, which is not a failure
@given(st.integers(min_value=0, max_value=2**60), st.integers(min_value=1, max_value=3))
def test_a_printed_size_reads_back_within_its_rounding(n, digits):
    text = format_bytes(n, digits=digits)
    number, unit = text.split()
    assert unit in ("B", "KiB", "MiB", "GiB", "TiB")
    back = parse_size(text)
    scale = parse_size(f"1 {unit}")
    assert abs(back - n) <= scale * 0.5 * 10**-digits + 1, (n, text)
