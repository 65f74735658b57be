"""Binary searches over a sorted slice of an array, for jitted code (the
access index, the exchange schedule's bookings, the redistribution's cuts)."""

from __future__ import annotations

from tilecommon.jit import kjit


@kjit
def bisect_right(values, start, stop, x):  # type: ignore[no-untyped-def]
    """The first index i in [start, stop) with values[i] > x (`stop` if none);
    values[start:stop] ascending."""
    a, b = start, stop
    while a < b:
        m = (a + b) // 2
        if values[m] <= x:
            a = m + 1
        else:
            b = m
    return a


@kjit
def bisect_left(values, start, stop, x):  # type: ignore[no-untyped-def]
    """The first index i in [start, stop) with values[i] >= x (`stop` if none);
    values[start:stop] ascending."""
    a, b = start, stop
    while a < b:
        m = (a + b) // 2
        if values[m] < x:
            a = m + 1
        else:
            b = m
    return a
