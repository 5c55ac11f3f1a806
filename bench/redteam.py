"""The red-team figures: runs tests/integration/test_redteam.py with ORCHARD_REDTEAM_REPORT set and prints, per
attack class, the attempts, how many got through and how many bytes or records the service lost, summed over every
image and test. One JSON object (the README's security table).

    python bench/redteam.py
"""

from __future__ import annotations

import collections
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    with tempfile.NamedTemporaryFile(suffix=".jsonl") as report:
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "pytest",
                "-q",
                "-p",
                "no:cacheprovider",
                str(ROOT / "tests" / "integration" / "test_redteam.py"),
            ],
            cwd=ROOT,
            env={**__import__("os").environ, "ORCHARD_REDTEAM_REPORT": report.name},
            capture_output=True,
            text=True,
        )
        lines = Path(report.name).read_text().splitlines()
    totals: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    for line in lines:
        for cls, counts in json.loads(line).items():
            totals[cls].update(counts)
    summary = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else done.stderr[-500:]
    print(
        json.dumps(
            {
                "classes": {cls: dict(c) for cls, c in sorted(totals.items())},
                "attempts": sum(c["attempts"] for c in totals.values()),
                "through": sum(c["through"] for c in totals.values()),
                "lost": sum(c["lost"] for c in totals.values()),
                "pytest": summary,
            }
        )
    )
    sys.exit(done.returncode)


if __name__ == "__main__":
    main()
