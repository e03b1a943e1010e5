"""What counts as a tensor's shape in a trace's `Input Dims`: one definition for every reader.

A run records a shape as a list of whole numbers, none negative. A bool (JSON `true` is an int
to Python), a negative count or a float is a damaged or forged trace: such a "shape" has no
elements, so no cost, copy size or cast is figured from it, rather than a negative or unit one.
"""

from __future__ import annotations

import math

import numpy as np


def is_shape(value: object, min_dims: int = 0) -> bool:
    """A recorded shape of at least `min_dims` dimensions (a scalar's is `[]`)."""
    return isinstance(value, (list, tuple)) and len(value) >= min_dims and all(type(x) is int and x >= 0 for x in value)


def numel(dims: object) -> int:
    """Elements of a shape; 0 for anything that is not one."""
    if not is_shape(dims):
        return 0
    n = math.prod(dims)  # np.prod's value wherever that fits in int64 (its wrapped product otherwise)
    return n if n < 2**63 else int(np.prod(dims))
