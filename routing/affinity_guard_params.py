"""The affinity_guard picker's parameters: defaults, one-line meanings, and their checks."""

from __future__ import annotations

from dataclasses import dataclass

from routing.plugin import param


@dataclass(frozen=True, slots=True)
class Params:
    """Parameters of the affinity_guard picker."""

    guard_ratio: float = param(1.5, "load allowed relative to the mean candidate load")
    guard_slack: float = param(2.0, "requests allowed above guard_ratio x mean load")
    min_match_blocks: int = param(1, "matched prefix blocks that make a replica a holder")
    prefix_holders: bool = param(True, "follow prefix holders (tier 2, step 2)")
    full_allowance_share: float | None = param(None, "KV share a match fills for the whole guard")
    inflight: float | None = param(None, "least w making a prefix in flight a holder (None: off)")
    share_window: int = param(0, "recent picks each replica's share is counted over (0: off)")
    share_ratio: float = param(2.0, "share allowed relative to the mean recent share")
    share_slack: float = param(8.0, "picks allowed above share_ratio x mean recent share")
    share_all: bool = param(False, "bound full matches and affinity too (w = 1)")
    share_band: float = param(1.0, "load above the least placed by fewest picks (bound only)")
    join_slack: float | None = param(None, "new conversations above the fewest's (None: off)")
    yield_slack: float | None = param(None, "requests an equal holder undercuts affinity by")
    seed: int | None = param(None, "seed of the tie-break generator (None: from the OS)")

    def __post_init__(self) -> None:
        share = self.full_allowance_share
        checks = {
            "guard_ratio >= 1, guard_slack >= 0": self.guard_ratio >= 1 and self.guard_slack >= 0,
            "min_match_blocks >= 1": self.min_match_blocks >= 1,
            "full_allowance_share in (0, 1] or None": share is None or 0 < share <= 1,
            "share_window >= 0, share_band >= 0": min(self.share_window, self.share_band) >= 0,
            "share_ratio >= 1, share_slack >= 0": self.share_ratio >= 1 and self.share_slack >= 0,
            "join_slack >= 0 or None": self.join_slack is None or self.join_slack >= 0,
            "yield_slack >= 0 or None": self.yield_slack is None or self.yield_slack >= 0,
        }
        if failed := [rule for rule, ok in checks.items() if not ok]:
            raise ValueError("need " + "; ".join(failed))
