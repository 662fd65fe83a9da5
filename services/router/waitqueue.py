"""The router's queue: requests waiting for a replica, served oldest first.

How it works: each waiting request holds an `asyncio.Event` in a deque. Only the head may take a
replica. `wake_head` sets the head's event (a request finished, the membership changed, a backoff
ran out); a head that leaves, with a replica or without (its deadline), wakes the next one, so
capacity freed at once is handed down the line one waiter at a time. A newcomer joins behind
everyone already waiting; a request a replica refused after it left the queue rejoins at the
front, since it is the oldest.

Why not wake every waiter and let them race: one finish frees one slot, so all but one waiter
wake for nothing, and which one wins is random, so a request's wait no longer depends on its
age (a long tail under saturation). Serving oldest first makes the wait of a request the time
until the requests ahead of it are served, which is also what the what-if model simulates.
"""

from __future__ import annotations

import asyncio
from collections import deque


class WaitQueue:
    __slots__ = ("_waiters",)

    def __init__(self) -> None:
        self._waiters: deque[asyncio.Event] = deque()

    def __len__(self) -> int:
        return len(self._waiters)

    def join(self, *, front: bool = False) -> asyncio.Event:
        """A place in the line: behind everyone, or at the front for a refused request."""
        waiter = asyncio.Event()
        if front:
            self._waiters.appendleft(waiter)
        else:
            self._waiters.append(waiter)
        return waiter

    def is_head(self, waiter: asyncio.Event) -> bool:
        return bool(self._waiters) and self._waiters[0] is waiter

    def wake_head(self) -> None:
        if self._waiters:
            self._waiters[0].set()

    def wake_all(self) -> None:
        """Closing: every waiter must look (and find the router closed)."""
        for waiter in self._waiters:
            waiter.set()

    def leave(self, waiter: asyncio.Event) -> None:
        """Out of the line; a head that leaves hands its turn to the next."""
        if self.is_head(waiter):
            self._waiters.popleft()
            self.wake_head()
        else:
            # only a deadline or a cancel leaves from behind the head: O(n) there is rare
            self._waiters.remove(waiter)
