"""Admin keys that a reload replaces in place: the front ends keep the one object they hold."""

from __future__ import annotations

from collections.abc import Iterable

from gateway.proxy.identity import ApiKeys


class ReloadableKeys(ApiKeys):
    """ApiKeys whose set of digests a configuration reload swaps (one assignment: atomic)."""

    __slots__ = ()

    def replace(self, keys: Iterable[str]) -> None:
        """From now on, exactly `keys` open the admin routes."""
        self._digests = ApiKeys(keys)._digests
