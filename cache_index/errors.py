"""Root error type of the cache_index package."""


class CacheIndexError(Exception):
    """Base class for every error raised by cache_index."""
