"""Membership and ring by consensus (hetobs.diagnosis.loader.consensus): counted by value.

The readers intern equal lists into one object, which makes counting cheap; but equal lists
read by different tables (parallel workers, two membership files with the same ranks, a 1.x
inline list beside a 2.x file) are different objects, and each must count for its value."""

from __future__ import annotations

from hetobs.diagnosis.loader import consensus


def test_equal_lists_in_different_objects_are_one_vote() -> None:
    a = (0, 1, 2, 3)
    b1, b2 = (0, 2, 1, 3), tuple(x for x in (0, 2, 1, 3))  # equal, two objects (by identity: a tie, a won)
    shared = [0, 2, 1, 3]
    assert consensus([a, b1, b2]) == (0, 2, 1, 3)
    assert consensus([a, a, list(shared), list(shared), list(shared)]) == [0, 2, 1, 3]


def test_interned_votes_count_each_reference() -> None:
    a, b = (0, 1, 2), (2, 1, 0)
    assert consensus([a, b, b, a, a]) is a
    assert consensus([b] * 3 + [a] * 2) is b


def test_a_tie_goes_to_the_value_seen_first_and_nothing_is_none() -> None:
    assert consensus([(1, 0), (0, 1)]) == (1, 0)
    assert consensus([(0, 1), [1, 0], (1, 0)]) == [1, 0]  # a list and a tuple of the same ranks: one value
    assert consensus([]) is None
