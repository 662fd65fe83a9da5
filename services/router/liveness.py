"""Is a replica still connected? One answer per replica, shared by every request held on it.

How it works: everything this router receives from a replica (an admission, a chunk, a health
frame, a probe answer) counts one on that replica's `heard` counter. A response reader notes
the counter when it starts waiting; when it has heard nothing on its own request for
`liveness_interval_s`:
1. if the counter moved meanwhile, the replica spoke on another request: its connection is
   alive, no probe; the reader notes the counter and waits another interval;
2. else it asks `gone(replica)`: a probe already in flight to the replica (started by another
   silent request) is shared, or a new probe goes to `fp.v1.probe.{replica}`, where "no
   responders" means the replica's connection is gone.
So N requests held on one replica cost at most one probe per interval, not N, and none while
the replica is heard from anyway (a frame per interval, say). A lost connection is noticed
within two intervals (one if nothing else was heard from it). No clock: counters, not times,
so it behaves the same on any clock. An alive replica that is merely slow answers probes; only a
lost connection ends a request here.

A live replica can still have lost one request's reply (its NATS connection, or a route between
NATS nodes, dropped after it admitted the request). It keeps being heard on other requests, so
step 1 would wait for ever; a reader silent for several intervals while the replica speaks asks
`holds(replica, request_id)`: a probe naming the request, answered `not_held` by a replica that
no longer runs it.

The decisions are pure (silence.py): when a silent reader probes, and what a probe reply says;
this module keeps the counters and runs the probes.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable, Mapping

from services.router.silence import probe_reply
from shared.badinput import BadInput
from shared.bus import Bus
from shared.clock import Clock
from shared.errors import BusError, NoResponders
from shared.subjects import Subjects
from shared.wire.codec import encode
from shared.wire.messages import HealthStatus, ProbeRequest

FoldHealth = Callable[[HealthStatus, float], None]


class Liveness:
    __slots__ = (
        "_bad_input", "_bus", "_clock", "_fold", "_heard", "_probes", "_subjects", "interval_s",
        "probe_subjects", "probe_timeout_s", "probes_sent",
    )  # fmt: skip

    def __init__(
        self,
        bus: Bus,
        clock: Clock,
        subjects: Subjects,
        *,
        interval_s: float,
        probe_timeout_s: float,
        fold: FoldHealth,
        bad_input: BadInput,
    ) -> None:
        self._bus, self._clock, self._subjects = bus, clock, subjects
        self.interval_s, self.probe_timeout_s = interval_s, probe_timeout_s
        self._fold, self._bad_input = fold, bad_input
        self._heard: dict[str, int] = {}
        """Replica -> how many messages we received from it (only ever compared for change)."""
        self._probes: dict[str, asyncio.Task[bool]] = {}
        self.probe_subjects: Mapping[str, str] = {}
        self.probes_sent = 0

    def heard(self, replica_id: str) -> None:
        """Something arrived from the replica (O(1): on the request path)."""
        self._heard[replica_id] = self._heard.get(replica_id, 0) + 1

    def mark(self, replica_id: str) -> int:
        """The replica's counter now (a reader compares it after a silent interval)."""
        return self._heard.get(replica_id, 0)

    def prune_to(self, members: Iterable[str]) -> None:
        keep = set(members)
        for rid in [r for r in self._heard if r not in keep]:
            del self._heard[rid]

    async def gone(self, replica_id: str) -> bool:
        """True when the replica's connection is gone (see the module docstring)."""
        task = self._probes.get(replica_id)
        if task is None:
            task = asyncio.get_running_loop().create_task(self._probe(replica_id))
            self._probes[replica_id] = task
            task.add_done_callback(lambda _: self._probes.pop(replica_id, None))
        # another waiter's cancellation must not cancel the probe it shares
        return await asyncio.shield(task)

    async def holds(self, replica_id: str, request_id: str) -> bool:
        """False when the replica is gone or says it does not hold `request_id` (its reply, if
        any, was sent and lost); True when it holds it, or when we cannot tell (no answer in
        time, an old replica that ignores the request id)."""
        return not await self._probe(replica_id, request_id)

    async def _probe(self, replica_id: str, request_id: str | None = None) -> bool:
        """True when the replica is gone (or, asked about `request_id`, does not hold it)."""
        subject = self.probe_subjects.get(replica_id) or self._subjects.probe(replica_id)
        self.probes_sent += 1
        probe = ProbeRequest(self._clock.wall(), request_id)
        try:
            reply = await self._bus.request(subject, encode(probe), timeout=self.probe_timeout_s)
        except NoResponders:
            return True
        except BusError:
            return False  # alive but slow, or the bus hiccuped: keep waiting, probe again later
        self.heard(replica_id)
        verdict = probe_reply(reply.data, request_id)
        if verdict.bad is not None:
            self._bad_input.drop(verdict.bad.reason, f"probe reply from {replica_id}")
        elif verdict.health is not None:
            self._fold(verdict.health, self._clock.monotonic())
        return verdict.gone
