from __future__ import annotations

import pytest

from coremesh.core import CollectiveIdAllocator, CollectiveIdError


def test_distinct_lowest_free_ids() -> None:
    a = CollectiveIdAllocator(4)
    assert [a.allocate(f"k{i}") for i in range(3)] == [0, 1, 2]
    a.release(1)
    assert a.allocate("again") == 1
    assert a.owner(1) == "again"


def test_exhaustion_names_the_owners_and_the_fix() -> None:
    a = CollectiveIdAllocator(2, first=5)
    a.allocate("ring")
    a.allocate("barrier")
    with pytest.raises(CollectiveIdError) as e:
        a.allocate("late")
    msg = str(e.value)
    assert "'late'" in msg and "all 2 ids" in msg and "5: ring" in msg and "5..6" in msg


def test_claim_refuses_taken_and_out_of_range() -> None:
    a = CollectiveIdAllocator(8)
    a.claim(3, "first")
    with pytest.raises(CollectiveIdError, match=r"already taken by 'first'"):
        a.claim(3, "second")
    with pytest.raises(CollectiveIdError, match="outside the pool"):
        a.claim(8, "x")


def test_scope_releases() -> None:
    a = CollectiveIdAllocator(2)
    keep = a.allocate("keep")
    with a.scope():
        a.allocate("tmp")
        assert len(a.in_use) == 2
    assert a.in_use == {keep: "keep"}
    with pytest.raises(CollectiveIdError, match="not allocated"):
        a.release(1)


def test_bad_pool() -> None:
    with pytest.raises(CollectiveIdError):
        CollectiveIdAllocator(0)


def test_id_for_is_stable_per_owner() -> None:
    a = CollectiveIdAllocator(4)
    first = a.id_for("coremesh.reduce")
    assert a.id_for("coremesh.reduce") == first
    assert a.id_for("other") != first
    assert len(a.in_use) == 2
