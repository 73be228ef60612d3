"""Write tests/file-seconds.json: the seconds each test file took in a run of the suite
(its tests' setup, call and teardown, summed from pytest's JUnit XML), for the files
that take 2 s or more. tests/conftest.py runs the heaviest files first under
``--dist loadfile``, so that no worker is left with a long file at the end.

    pytest -n 2 --dist loadfile --junitxml=/tmp/junit.xml
    python scripts/test_file_seconds.py /tmp/junit.xml

The figures only order the files: a stale or missing entry costs time, never a result.
"""

import json
import sys
import xml.etree.ElementTree as ET
from collections import Counter
from pathlib import Path

OUT = Path(__file__).resolve().parents[1] / "tests" / "file-seconds.json"
AT_LEAST = 2.0


def main(junit: str) -> None:
    seconds: Counter[str] = Counter()
    for case in ET.parse(junit).iter("testcase"):
        # classname "tests.test_x" (or "tests.test_x.TestClass"): the file is its first two parts
        parts = case.get("classname", "").split(".")
        if len(parts) >= 2 and parts[0] == "tests":
            seconds[f"{parts[1]}.py"] += float(case.get("time", 0.0))
    kept = {name: round(s, 1) for name, s in seconds.most_common() if s >= AT_LEAST}
    OUT.write_text(json.dumps(kept, indent=1) + "\n")
    total = sum(seconds.values())
    print(f"{OUT}: {len(kept)} files of {len(seconds)}, {sum(kept.values()):.0f} of {total:.0f} s")


if __name__ == "__main__":
    main(sys.argv[1])
