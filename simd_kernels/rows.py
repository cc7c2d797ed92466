"""Row grouping shared by the fused kernels: four weight rows share every activation load."""

from __future__ import annotations

from .jit import njit

GROUP = 4  # weight rows per parallel work item


@njit(inline="always")
def n_groups(n_rows):
    return (n_rows + GROUP - 1) // GROUP


@njit(inline="always")
def group_rows(g, n_rows):
    """The four row indices of group g; past the end they repeat the last row (same value rewritten)."""
    last = n_rows - 1
    r0 = g * GROUP
    return min(r0, last), min(r0 + 1, last), min(r0 + 2, last), min(r0 + 3, last)
