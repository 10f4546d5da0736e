"""Work released at once in threads, each on its own database connection: what the concurrency
tests of the domains' gateways race with."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TypeVar

from django.db import connection

T = TypeVar("T")


def run_together(count: int, work: Callable[[int], T]) -> list[T | BaseException]:
    """Run work(0..count-1) in as many threads, released at once; each result or exception."""
    barrier = threading.Barrier(count)
    results: list[T | BaseException] = [RuntimeError("never ran")] * count

    def thread(index: int) -> None:
        try:
            barrier.wait(timeout=30)
            results[index] = work(index)
        except BaseException as exc:
            results[index] = exc
        finally:
            connection.close()

    threads = [threading.Thread(target=thread, args=(i,)) for i in range(count)]
    for each in threads:
        each.start()
    for each in threads:
        each.join(timeout=60)
    assert not any(each.is_alive() for each in threads)
    return results
