"""Consumer-group ownership rules on a simulated timeline (no sockets)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from services.controller.group import (
    GroupCore,
    Lease,
    Lose,
    Release,
    Take,
    fnv1a_32,
    partition_of,
)

P = 16


class KV:
    """A toy compare-and-set store with one revision counter, like a NATS KV bucket."""

    def __init__(self) -> None:
        self.rev = 0
        self.leases: dict[int, Lease] = {}

    def cas(self, p: int, owner: str, epoch: int, expected: Lease | None) -> Lease | None:
        held = self.leases.get(p)
        if (held.revision if held else None) != (expected.revision if expected else None):
            return None
        self.rev += 1
        self.leases[p] = Lease(p, owner, epoch, self.rev)
        return self.leases[p]


def step(g: GroupCore, kv: KV, now: float) -> None:
    """One group tick of a member: see the leases, carry out its plan."""
    for lease in kv.leases.values():
        g.lease_seen(lease)
    for a in g.plan(now):
        if isinstance(a, Take):
            epoch = (a.lease.epoch if a.lease else 0) + 1
            got = kv.cas(a.partition, g.member_id, epoch, a.lease)
            if got:
                g.took(got)
        elif isinstance(a, Release):
            g.released(a.partition)
            kv.cas(a.partition, "", a.lease.epoch, a.lease)
        elif isinstance(a, Lose):
            g.released(a.partition)


def run(members: list[GroupCore], kv: KV, now: float, ticks: int = 4) -> None:
    for _ in range(ticks):
        for g in members:
            for other in members:
                g.member_seen(other.member_id, now)
            step(g, kv, now)


def owners(kv: KV) -> dict[int, str]:
    return {p: lease.owner for p, lease in kv.leases.items()}


def test_single_member_owns_everything() -> None:
    kv = KV()
    a = GroupCore("a", P)
    run([a], kv, 0.0)
    assert set(a.owned) == set(range(P)) and set(owners(kv).values()) == {"a"}
    assert all(e == 1 for e in a.owned.values())


def test_join_rebalances_to_floor_or_ceil_and_ownership_is_exclusive() -> None:
    kv = KV()
    a, b, c = GroupCore("a", P), GroupCore("b", P), GroupCore("c", P)
    run([a], kv, 0.0)
    run([a, b, c], kv, 1.0)
    counts = sorted(len(g.owned) for g in (a, b, c))
    assert counts == [5, 5, 6]
    assert not (
        set(a.owned) & set(b.owned) or set(b.owned) & set(c.owned) or set(a.owned) & set(c.owned)
    )
    assert set(a.owned) | set(b.owned) | set(c.owned) == set(range(P))
    # every partition that moved was taken at a higher epoch
    assert all(kv.leases[p].epoch == 2 for p in b.owned)


def test_dead_member_is_taken_over_with_a_new_epoch() -> None:
    kv = KV()
    a, b = GroupCore("a", P, member_ttl_s=3.0), GroupCore("b", P, member_ttl_s=3.0)
    run([a, b], kv, 0.0)
    a_parts = set(a.owned)
    for now in (1.0, 2.0, 3.5):  # only b keeps beating; a's last beat was at 0.0
        b.member_seen("b", now)
        step(b, kv, now)
    assert set(b.owned) == set(range(P))
    assert all(kv.leases[p].epoch == 2 for p in a_parts)
    # a wakes up (SIGCONT): it sees the leases name b and stops at once
    a.member_seen("a", 4.0)
    a.member_seen("b", 4.0)
    for lease in kv.leases.values():
        a.lease_seen(lease)
    plan = a.plan(4.0)
    assert {x.partition for x in plan if isinstance(x, Lose)} == a_parts
    assert not any(isinstance(x, Take) for x in plan)


def test_a_live_owner_is_never_taken_from_only_handed_over() -> None:
    kv = KV()
    a, b = GroupCore("a", P), GroupCore("b", P)
    run([a], kv, 0.0)
    b.member_seen("a", 1.0)
    b.member_seen("b", 1.0)
    for lease in kv.leases.values():
        b.lease_seen(lease)
    assert not any(isinstance(x, Take) for x in b.plan(1.0))  # a is alive and has not released


def test_clean_leave_hands_over_immediately() -> None:
    kv = KV()
    a, b = GroupCore("a", P), GroupCore("b", P)
    run([a, b], kv, 0.0)
    b.member_left("a")  # a deleted its member entry on SIGTERM
    step(b, kv, 0.1)
    assert set(b.owned) == set(range(P))


def test_invisible_self_owns_nothing() -> None:
    a = GroupCore("a", P)
    a.owned = {1: 3}
    assert a.plan(0.0) == [Lose(1)]


@given(st.lists(st.sampled_from("abcdefg"), min_size=1, max_size=7, unique=True))
def test_any_membership_converges_to_a_balanced_exclusive_split(names: list[str]) -> None:
    kv = KV()
    groups = [GroupCore(n, P) for n in names]
    run(groups, kv, 0.0, ticks=6)
    counts = [len(g.owned) for g in groups]
    assert sum(counts) == P and max(counts) - min(counts) <= 1
    seen: set[int] = set()
    for g in groups:
        assert not seen & set(g.owned)
        seen |= set(g.owned)
        assert all(kv.leases[p].owner == g.member_id for p in g.owned)


def test_fnv1a_matches_known_vectors() -> None:
    assert fnv1a_32(b"") == 0x811C9DC5
    assert fnv1a_32(b"a") == 0xE40C292C
    assert fnv1a_32(b"foobar") == 0xBF9CF968
    assert 0 <= partition_of("shop", 16) < 16


def test_release_then_release_is_harmless() -> None:
    kv = KV()
    a = GroupCore("a", P)
    run([a], kv, 0.0)
    lease = kv.leases[0]
    a.released(0)
    a.released(0)
    assert Release(0, lease).partition == 0


def test_a_member_that_let_go_of_its_own_leases_takes_them_back_at_a_new_epoch() -> None:
    """A refresh that failed makes a member drop its partitions while KV still names it; it
    must take them again (it was the only member, nobody else would)."""
    kv = KV()
    a = GroupCore("a", P)
    run([a], kv, 0.0)
    for p in list(a.owned):
        a.released(p)  # "cannot refresh membership: dropping partition p"
    run([a], kv, 1.0)
    assert set(a.owned) == set(range(P)) and all(e == 2 for e in a.owned.values())
