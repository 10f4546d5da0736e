"""What a call reads ahead is kept for that call alone, and served once."""

from __future__ import annotations

import pytest

from dispatch import readahead
from dispatch.pipeline.state import Lookup

ORDER: Lookup = ("test.order", ("ORD-1", "CUS-1"))


def test_a_record_kept_in_a_call_is_taken_once() -> None:
    with readahead.call_reads():
        readahead.keep(ORDER, "the order")

        assert readahead.take(ORDER) == (True, "the order")
        assert readahead.take(ORDER) == (False, None)


def test_a_record_read_ahead_and_not_found_is_served_as_none() -> None:
    with readahead.call_reads():
        readahead.keep(ORDER, None)

        assert readahead.take(ORDER) == (True, None)


def test_only_the_same_lookup_is_served() -> None:
    with readahead.call_reads():
        readahead.keep(ORDER, "the order")

        assert readahead.take(("test.order", ("ORD-1", "CUS-2"))) == (False, None)
        assert readahead.take(("test.other", ("ORD-1", "CUS-1"))) == (False, None)


def test_what_a_call_kept_is_gone_when_it_ends() -> None:
    with readahead.call_reads():
        readahead.keep(ORDER, "the order")

    assert readahead.take(ORDER) == (False, None)
    with readahead.call_reads():
        assert readahead.take(ORDER) == (False, None)


def test_nothing_is_kept_outside_a_call() -> None:
    with pytest.raises(RuntimeError, match="only inside a call"):
        readahead.keep(ORDER, "the order")
    assert readahead.take(ORDER) == (False, None)


def test_a_source_cannot_be_registered_twice_with_another_read() -> None:
    readahead.source_register("test.twice", sql="SELECT 1", to_value=tuple)
    readahead.source_register("test.twice", sql="SELECT 1", to_value=tuple)

    with pytest.raises(ValueError, match="already registered"):
        readahead.source_register("test.twice", sql="SELECT 2", to_value=tuple)
