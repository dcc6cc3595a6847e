"""Prometheus text read back (a replica's or a gateway's /metrics): the samples of one name."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families


def samples(text: str, name: str) -> list[tuple[dict[str, str], float]]:
    """Every sample called `name` in Prometheus exposition `text`: (labels, value)."""
    return [
        (s.labels, s.value)
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
        if s.name == name
    ]
