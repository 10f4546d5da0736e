"""The ids the core gives calls and confirmations: unique, in every thread and every process."""

from __future__ import annotations

import os
import re
import threading
import time

import pytest

from dispatch.pipeline.engine import _IDS_PER_READ, _new_id


def test_ids_are_32_hex_digits_and_never_repeat() -> None:
    ids = [_new_id() for _ in range(20 * _IDS_PER_READ + 7)]

    assert len(set(ids)) == len(ids)
    assert all(re.fullmatch(r"[0-9a-f]{32}", call_id) for call_id in ids)


def test_an_id_taken_later_sorts_after_so_that_new_ids_go_to_the_end_of_their_index() -> None:
    before_ms = time.time_ns() // 1_000_000
    first = _new_id()
    time.sleep(0.002)
    later = [_new_id() for _ in range(2 * _IDS_PER_READ)]

    assert all(first < call_id for call_id in later)
    # Led by the milliseconds since the epoch, then 80 random bits.
    assert int(first[:12], 16) >= before_ms
    assert len({call_id[12:] for call_id in later}) == len(later)


def test_threads_taking_ids_at_once_never_share_one() -> None:
    taken: list[list[str]] = [[] for _ in range(8)]
    start = threading.Barrier(len(taken))

    def take(into: list[str]) -> None:
        start.wait()
        into.extend(_new_id() for _ in range(3 * _IDS_PER_READ))

    threads = [threading.Thread(target=take, args=(into,)) for into in taken]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    everything = [call_id for into in taken for call_id in into]
    assert len(set(everything)) == len(everything) == 8 * 3 * _IDS_PER_READ


@pytest.mark.skipif(not hasattr(os, "fork"), reason="processes are forked only on POSIX")
def test_a_forked_process_does_not_hand_out_its_parents_ids() -> None:
    _new_id()  # the parent has read ids it has not handed out yet
    read, write = os.pipe()
    child = os.fork()
    if child == 0:  # pragma: no cover - runs in the child
        os.close(read)
        os.write(write, "".join(_new_id() for _ in range(_IDS_PER_READ)).encode())
        os._exit(0)
    os.close(write)
    with os.fdopen(read) as pipe:
        text = pipe.read()
    os.waitpid(child, 0)
    in_child = {text[at : at + 32] for at in range(0, len(text), 32)}
    in_parent = {_new_id() for _ in range(_IDS_PER_READ)}

    assert len(in_child) == _IDS_PER_READ
    assert not in_child & in_parent
