"""One customer's money in one currency, summed as it comes and goes: what the in-memory store
answers the allowance with (dispatch/pipeline/allowance.py) without reading the whole window.

A movement counts in the customer's sum as allowance.py says: moved money while the window
reaches back to its time, held money until its expiry, approved money until it is executed. The
sums, the count and the latest movements are kept for the window as it
stands after the latest request (its frontier): moved money leaves them from a queue in the order
of its time as the window's start passes it, held money from a heap in the order of its expiry as
the requests' time passes it. A request whose window starts before the frontier's, or whose time
is before it (a clock stepped back, a policy with a longer window), is answered by reading every
live movement, as before the sums existed; it does not move the frontier.

Every structure but `entries` may hold stale references: each entry's stamp changes whenever it
leaves the sums, and a reference whose stamp is not its entry's is dropped where it is met (at a
queue's ends). When the stale ones outnumber the rest, the queues and the heap are rebuilt: each
reference costs O(1) amortised, and they hold O(live movements).
"""

from __future__ import annotations

import heapq
import itertools
from collections import deque
from dataclasses import dataclass
from datetime import datetime

from dispatch.pipeline.allowance import (
    HELD,
    MOVED,
    ON_ITS_WAY,
    REVIEWER,
    SHOWN,
    AllowanceHistory,
    AllowanceRequest,
    Movement,
)

# A reference in a time-ordered queue: the movement's time and its reservation's position (ties
# on time keep the order of reservation), the entry's stamp when queued, and its key.
_Ref = tuple[datetime, int, int, str]
_Twin = tuple[str, str, int]


@dataclass(slots=True)
class _Entry:
    movement: Movement
    # The order of its reservation among the customer's movements.
    position: int
    # When held money stops counting; None while it is not held or counts until decided.
    expires_at: datetime | None
    stamp: int = 0
    counted: bool = False


class CustomerWindow:
    """The live movements of one customer in one currency, and the sums that count of them."""

    __slots__ = (
        "_cents",
        "_count",
        "_expiries",
        "_held_cents",
        "_moved",
        "_now",
        "_positions",
        "_reviewed_cents",
        "_since",
        "_stale",
        "_stamps",
        "_twins",
        "_waiting",
        "entries",
    )

    def __init__(self) -> None:
        # Every live movement by key, in the order of its reservation.
        self.entries: dict[str, _Entry] = {}
        self._cents = self._count = self._held_cents = self._reviewed_cents = 0
        # What counts, by time: moved money (it leaves from the left), and money on its way.
        self._moved: deque[_Ref] = deque()
        self._waiting: deque[_Ref] = deque()
        # Held money's expiries: (expires_at, stamp, key).
        self._expiries: list[tuple[datetime, int, str]] = []
        # Every live movement by tool, subject and amount, whether it counts in the sum or not:
        # its keys (a call's possible duplicates, sought over the policy's look-back).
        self._twins: dict[_Twin, dict[str, None]] = {}
        # Stale references in _moved and _waiting.
        self._stale = 0
        # The frontier: the latest request's window start and time (None before any request).
        self._since: datetime | None = None
        self._now: datetime | None = None
        self._positions = itertools.count()
        self._stamps = itertools.count(1)

    # Changes ----------------------------------------------------------------------------------

    def reserve(self, movement: Movement, expires_at: datetime | None) -> None:
        """A new live movement (the key's earlier one, if any, released first)."""
        self.release(movement.key)
        entry = _Entry(movement, next(self._positions), expires_at)
        self.entries[movement.key] = entry
        self._index(movement)
        if self._counts_at_frontier(entry):
            self._count_in(entry)

    def release(self, key: str) -> Movement | None:
        """The key's movement no longer counts, nor is kept; returns it, if there was one."""
        entry = self.entries.pop(key, None)
        if entry is None:
            return None
        self._unindex(entry.movement)
        if entry.counted:
            self._count_out(entry)
            self._tidy()
        return entry.movement

    def replace(self, key: str, movement: Movement, expires_at: datetime | None) -> None:
        """The key's movement changes state (approved, executed), keeping its place."""
        entry = self.entries[key]
        before = entry.movement
        if (
            entry.counted
            and before.approval in ON_ITS_WAY
            and movement.approval in ON_ITS_WAY
            and before._replace(approval=movement.approval) == movement
        ):
            # Held to approved: the same money on its way, in the same place; its expiry's
            # reference in the heap is dropped when met (it is no longer held).
            entry.movement, entry.expires_at = movement, expires_at
            return
        if entry.counted:
            self._count_out(entry)
        self._unindex(before)
        entry.movement, entry.expires_at = movement, expires_at
        self._index(movement)
        if self._counts_at_frontier(entry):
            self._count_in(entry)
        self._tidy()

    # The request's figures -------------------------------------------------------------------

    def history(self, request: AllowanceRequest, agent_day_cents: int) -> AllowanceHistory:
        """The customer's sum at the request, its own keys left out, with the latest SHOWN
        movements (oldest first) and the repeats of its tool, subject and amount (in the order
        of their reservation)."""
        own = (request.key, request.held_key)
        if not self._advance(request):
            return self._read_all(request, own, agent_day_cents)
        cents, count = self._cents, self._count
        held_cents, reviewed_cents = self._held_cents, self._reviewed_cents
        entries = self.entries
        for key in own:
            entry = entries.get(key)
            if entry is not None and entry.counted:
                amount, approval = entry.movement.amount_cents, entry.movement.approval
                cents -= amount
                count -= 1
                if approval in ON_ITS_WAY:
                    held_cents -= amount
                elif approval == REVIEWER:
                    reviewed_cents -= amount
        twins = self._twins.get((request.tool, request.subject, request.amount_cents))
        repeats: tuple[Movement, ...] = ()
        if twins:
            same = [
                entries[key]
                for key in twins
                if key not in own
                and counts(entries[key].movement, entries[key].expires_at, request, twins=True)
            ]
            same.sort(key=_position)
            repeats = tuple(entry.movement for entry in same)
        latest = self._latest(own)
        self._tidy()
        return AllowanceHistory(
            cents, count, latest, agent_day_cents, repeats, held_cents, reviewed_cents
        )

    def _advance(self, request: AllowanceRequest) -> bool:
        """Move the frontier to the request, if it is not behind it; whether it was."""
        since, now = request.since, request.at
        if (self._since is not None and since < self._since) or (
            self._now is not None and now < self._now
        ):
            return False
        self._since, self._now = since, now
        entries, expiries, moved = self.entries, self._expiries, self._moved
        while expiries and expiries[0][0] <= now:
            _, stamp, key = heapq.heappop(expiries)
            entry = entries.get(key)
            if entry is not None and entry.stamp == stamp and entry.movement.approval == HELD:
                self._count_out(entry)
        while moved and moved[0][0] < since:
            _, _, stamp, key = moved.popleft()
            entry = entries.get(key)
            if entry is not None and entry.stamp == stamp:
                self._count_out(entry)
            # Stale now if it was not before (_count_out counted it), and gone.
            self._stale -= 1
        return True

    def _latest(self, own: tuple[str, str]) -> tuple[Movement, ...]:
        """The latest SHOWN movements that count, the request's own left out, oldest first."""
        latest = self._tail(self._moved, own)
        waiting = self._tail(self._waiting, own)
        if waiting:
            latest = sorted(latest + waiting)[-SHOWN:]
        entries = self.entries
        return tuple(entries[ref[3]].movement for ref in latest)

    def _tail(self, queue: deque[_Ref], own: tuple[str, str]) -> list[_Ref]:
        """A queue's latest SHOWN live references, oldest first. The stale ones met on the way
        leave the queue, so that no request meets them again."""
        entries = self.entries
        live: list[_Ref] = []
        tail: list[_Ref] = []
        while queue and len(tail) < SHOWN:
            ref = queue.pop()
            entry = entries.get(ref[3])
            if entry is None or entry.stamp != ref[2]:
                self._stale -= 1
                continue
            live.append(ref)
            if ref[3] not in own:
                tail.append(ref)
        live.reverse()
        queue.extend(live)
        tail.reverse()
        return tail

    def _read_all(
        self, request: AllowanceRequest, own: tuple[str, str], agent_day_cents: int
    ) -> AllowanceHistory:
        """The history from every live movement (a request behind the frontier)."""
        window = [
            entry.movement
            for key, entry in self.entries.items()
            if key not in own and counts(entry.movement, entry.expires_at, request)
        ]
        same = (request.tool, request.subject, request.amount_cents)
        repeats = sorted(
            (
                entry
                for key, entry in self.entries.items()
                if key not in own
                and (entry.movement.tool, entry.movement.subject, entry.movement.amount_cents)
                == same
                and counts(entry.movement, entry.expires_at, request, twins=True)
            ),
            key=_position,
        )
        return AllowanceHistory(
            customer_window_cents=sum(m.amount_cents for m in window),
            customer_window_count=len(window),
            customer_window=tuple(sorted(window, key=_time)[-SHOWN:]),
            agent_day_cents=agent_day_cents,
            repeats=tuple(entry.movement for entry in repeats),
            customer_held_cents=sum(m.amount_cents for m in window if m.approval in ON_ITS_WAY),
            customer_reviewed_cents=sum(m.amount_cents for m in window if m.approval == REVIEWER),
        )

    # The sums ---------------------------------------------------------------------------------

    def _counts_at_frontier(self, entry: _Entry) -> bool:
        movement = entry.movement
        if movement.approval in MOVED:
            return self._since is None or movement.at >= self._since
        if movement.approval == HELD:
            expires_at = entry.expires_at
            return expires_at is None or self._now is None or expires_at > self._now
        return True

    def _count_in(self, entry: _Entry) -> None:
        movement = entry.movement
        amount, approval = movement.amount_cents, movement.approval
        entry.counted, entry.stamp = True, next(self._stamps)
        self._cents += amount
        self._count += 1
        ref = (movement.at, entry.position, entry.stamp, movement.key)
        if approval in MOVED:
            if approval == REVIEWER:
                self._reviewed_cents += amount
            _enqueue(self._moved, ref)
        else:
            self._held_cents += amount
            _enqueue(self._waiting, ref)
            if approval == HELD and entry.expires_at is not None:
                heapq.heappush(self._expiries, (entry.expires_at, entry.stamp, movement.key))

    def _count_out(self, entry: _Entry) -> None:
        movement = entry.movement
        amount, approval = movement.amount_cents, movement.approval
        entry.counted, entry.stamp = False, next(self._stamps)
        self._cents -= amount
        self._count -= 1
        if approval in ON_ITS_WAY:
            self._held_cents -= amount
        elif approval == REVIEWER:
            self._reviewed_cents -= amount
        # Its reference in a queue is stale now.
        self._stale += 1

    def _index(self, movement: Movement) -> None:
        twin = (movement.tool, movement.subject, movement.amount_cents)
        keys = self._twins.get(twin)
        if keys is None:
            keys = self._twins[twin] = {}
        keys[movement.key] = None

    def _unindex(self, movement: Movement) -> None:
        twin = (movement.tool, movement.subject, movement.amount_cents)
        keys = self._twins[twin]
        del keys[movement.key]
        if not keys:
            del self._twins[twin]

    def _tidy(self) -> None:
        """Rebuild the queues and the heap once stale references are most of them."""
        if self._stale <= 64 or 2 * self._stale <= len(self._moved) + len(self._waiting):
            return
        entries = self.entries

        def valid(ref: _Ref) -> bool:
            entry = entries.get(ref[3])
            return entry is not None and entry.stamp == ref[2]

        self._moved = deque(ref for ref in self._moved if valid(ref))
        self._waiting = deque(ref for ref in self._waiting if valid(ref))
        self._expiries = [item for item in self._expiries if _held_live(entries, item)]
        heapq.heapify(self._expiries)
        self._stale = 0


def counts(
    movement: Movement,
    expires_at: datetime | None,
    request: AllowanceRequest,
    *,
    twins: bool = False,
) -> bool:
    """Whether a movement is in the customer's sum at the request's time (see allowance.py); with
    `twins`, whether it is among the request's possible duplicates (moved money over the
    policy's look-back instead of the window)."""
    if movement.approval in MOVED:
        return movement.at >= (request.twins_since if twins else request.since)
    if movement.approval == HELD:
        return expires_at is None or expires_at > request.at
    return True


def _enqueue(queue: deque[_Ref], ref: _Ref) -> None:
    # Money mostly comes in time order: appended; otherwise put in its place.
    if not queue or queue[-1] <= ref:
        queue.append(ref)
        return
    index = len(queue) - 1
    while index > 0 and queue[index - 1] > ref:
        index -= 1
    queue.insert(index, ref)


def _held_live(entries: dict[str, _Entry], item: tuple[datetime, int, str]) -> bool:
    entry = entries.get(item[2])
    return entry is not None and entry.stamp == item[1] and entry.movement.approval == HELD


def _position(entry: _Entry) -> int:
    return entry.position


def _time(movement: Movement) -> datetime:
    return movement.at
