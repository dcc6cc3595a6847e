"""Session affinity: hash of a session id (configured header or body `user`) -> replica."""

from __future__ import annotations

import xxhash

from cache_index.prompt_cache import PromptCache


def session_key(header_value: str | None, user: object) -> str | None:
    """The session id: the configured header when present, else the body's `user` string."""
    if header_value:
        return header_value
    if isinstance(user, str) and user:
        return user
    return None


def session_hash(session: str) -> int:
    """The key a session id is stored under (what other gateway processes are sent)."""
    return xxhash.xxh3_64_intdigest(session.encode("utf-8", "surrogatepass"))


_session_hash = session_hash


class SessionAffinity:
    """Bounded TTL map from a session id to the replica that last served the session.

    Keyed by xxh3 of the id, not the id itself, so an entry costs the same whatever the client
    sends.
    """

    def __init__(self, ttl_s: float = 600.0, max_entries: int = 100_000) -> None:
        self._cache = PromptCache(ttl_s=ttl_s, max_entries=max_entries)

    def __len__(self) -> int:
        return len(self._cache)

    @property
    def ttl_s(self) -> float:
        return self._cache.ttl_s

    def get(self, session: str, now: float) -> str | None:
        """The replica bound to `session`, or None when unknown or expired."""
        return self._cache.get(_session_hash(session), now)

    def put(self, session: str, replica: str, now: float) -> None:
        """Bind `session` to `replica` from `now`; the TTL restarts."""
        self._cache.put(_session_hash(session), replica, now)

    def put_if_newer(self, key: int, replica: str, at: float, now: float) -> bool:
        """Bind the session of `key` (`session_hash`) as of `at`, unless bound later."""
        return self._cache.put_if_newer(key, replica, at, now)

    def forget_replica(self, replica: str) -> int:
        """Unbind every session of `replica`; returns how many."""
        return self._cache.forget_replica(replica)

    def clear(self) -> None:
        """Drop every binding."""
        self._cache.clear()
