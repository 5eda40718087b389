"""A switch that plain calls set and `with` blocks hold, from any thread: `install()` and
`timing()`."""

from __future__ import annotations

import threading
from collections.abc import Callable


class Switch:
    """On while any `with` block that turned it on is open, in any thread; with none open, as
    the latest plain call left it, unless a block that turned it off is open. So a thread's
    block never ends another's: the last of the blocks to close decides.

    A call first sets it as a plain call would (`set`); its `with` block, once entered, takes
    that back and holds it instead (`hold`, then `release`)."""

    def __init__(self, apply: Callable[[bool], object]) -> None:
        self._apply = apply
        self._lock = threading.Lock()
        self._kept = False  # as the latest plain call left it
        self._blocks = {True: 0, False: 0}  # open blocks that turned it on, and off
        self._on = False

    def set(self, on: bool) -> bool:
        """Sets it as a plain call; returns the plain setting before, for `hold`."""
        with self._lock:
            before, self._kept = self._kept, on
            self._update()
            return before

    def hold(self, on: bool, kept_before: bool) -> None:
        """Enters a block of the call that `set` it to `on` (and found `kept_before`)."""
        with self._lock:
            self._kept = kept_before
            self._blocks[on] += 1
            self._update()

    def release(self, on: bool) -> None:
        """Leaves a block that `hold` entered."""
        with self._lock:
            self._blocks[on] -= 1
            self._update()

    def is_on(self) -> bool:
        return self._on

    def _update(self) -> None:
        on = self._blocks[True] > 0 or (self._kept and self._blocks[False] == 0)
        if on != self._on:
            self._apply(on)
            self._on = on
