"""Packing samples into rows of ``sequence_len``: first-fit-decreasing or best-fit, both longest first.

The bins depend only on the lengths and the seed (which orders samples of equal length), so every rank
computes the same rows without communication, and a resumed run finds them again. Rows are packed once
per run; each epoch visits them in its own seeded order (``BatchPlan``).
"""

from __future__ import annotations

import bisect
import random

import numpy as np


def _longest_first(lengths: np.ndarray, seed: int) -> list[int]:
    order = list(range(len(lengths)))
    random.Random(f"ktrain-pack:{seed}").shuffle(order)  # ties in length take a seeded order
    order.sort(key=lambda i: -int(lengths[i]))
    return order


def first_fit_decreasing(lengths: np.ndarray, capacity: int, seed: int) -> list[list[int]]:
    """Each sample, longest first, into the first row with room: a max-tree over the rows' free space."""
    n = len(lengths)
    size = 1
    while size < max(n, 1):
        size *= 2
    free = [capacity] * (2 * size)  # leaves: rows 0..size-1, all empty at first; inner nodes: max of children
    bins: list[list[int]] = []
    for i in _longest_first(lengths, seed):
        need = int(lengths[i])
        node = 1
        while node < size:  # descend to the leftmost row with room
            node = 2 * node if free[2 * node] >= need else 2 * node + 1
        row = node - size
        if row == len(bins):
            bins.append([])
        bins[row].append(i)
        free[node] -= need
        node //= 2
        while node:
            free[node] = max(free[2 * node], free[2 * node + 1])
            node //= 2
    return bins


def best_fit(lengths: np.ndarray, capacity: int, seed: int) -> list[list[int]]:
    """Each sample, longest first, into the row it fills most tightly: rows kept sorted by free space."""
    bins: list[list[int]] = []
    free: list[tuple[int, int]] = []  # (free space, row), sorted
    for i in _longest_first(lengths, seed):
        need = int(lengths[i])
        at = bisect.bisect_left(free, (need, -1))
        if at == len(free):
            bins.append([i])
            bisect.insort(free, (capacity - need, len(bins) - 1))
            continue
        space, row = free.pop(at)
        bins[row].append(i)
        bisect.insort(free, (space - need, row))
    return bins


METHODS = {"ffd": first_fit_decreasing, "best_fit": best_fit}


def pack(lengths: np.ndarray, capacity: int, method: str, seed: int) -> list[list[int]]:
    """Rows of sample indices (positions in ``lengths``), none longer than ``capacity`` tokens in all."""
    too_long = int(np.argmax(lengths)) if len(lengths) else 0
    if len(lengths) and lengths[too_long] > capacity:
        raise ValueError(f"sample {too_long} has {int(lengths[too_long])} tokens, more than a row of {capacity}")
    return METHODS[method](lengths, capacity, seed)


def efficiency(lengths: np.ndarray, rows: list[list[int]], row_length: int) -> float:
    """Share of the rows' tokens that are samples rather than padding."""
    return float(np.sum(lengths)) / max(1, len(rows) * row_length)
