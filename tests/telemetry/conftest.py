"""The simulated fleet fixture, shared with the gateway tests."""

from tests.gateway.conftest import fleet

__all__ = ["fleet"]
