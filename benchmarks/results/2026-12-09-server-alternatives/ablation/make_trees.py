"""Cut-out trees: the shipped tree with one layer of the request path removed (measurement only).

    python make_trees.py SRC OUT   # SRC: `git archive f546e8e` unpacked; writes OUT/<name>/

Each edit must match exactly once, so a tree that drifted from f546e8e fails loudly.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

_PIPELINE = "gateway/proxy/pipeline.py"
_METRICS = "telemetry/metrics.py"
_ONE = "Decision(pool.snapshots()[0], Branch.MISS_BY_LOAD, 0.0, {}, 1)"
_REQUESTS_INC = "self._child(self._requests, model, replica, str(status), branch).inc()"
_DECISION_DOC = '"""One routing decision (an attempt): where it went and by which branch."""\n'

CUTS: dict[str, list[tuple[str, str, str]]] = {
    # The first attempt takes the one replica without asking the router.
    "no_route": [
        (
            _PIPELINE,
            "return router.route(features, pool.snapshots()), False",
            f"return {_ONE}, False",
        ),
        (
            _PIPELINE,
            "features, lambda: router.route(features, pool.snapshots()), lane",
            f"features, lambda: {_ONE}, lane",
        ),
    ],
    # No prompt hashes, tier lookups or record: the parsed request's features as they are.
    "no_features": [
        (
            _PIPELINE,
            "features = await self._affinity.features_off_loop(req, client_headers)",
            "features = req.features",
        )
    ],
    # No per-request counter, histogram or decision counts.
    "no_metrics": [
        (
            _METRICS,
            f"    ) -> None:\n        {_REQUESTS_INC}",
            f"    ) -> None:\n        return\n        {_REQUESTS_INC}",
        ),
        (_METRICS, _DECISION_DOC, _DECISION_DOC + "        return\n"),
    ],
    # The first attempt skips the tier-3 admission queue.
    "no_admission": [
        (
            _PIPELINE,
            "        if self._admission is None:\n            return router.route",
            "        if True:\n            return router.route",
        )
    ],
}


def main(src: Path, out: Path) -> None:
    for name, edits in CUTS.items():
        dst = out / name
        if dst.exists():
            shutil.rmtree(dst)
        shutil.copytree(src, dst, symlinks=True)
        for rel, old, new in edits:
            path = dst / rel
            text = path.read_text()
            if text.count(old) != 1:
                raise SystemExit(f"{name}: {rel} does not contain the edit's text exactly once")
            path.write_text(text.replace(old, new))
        print(name, "written")


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
