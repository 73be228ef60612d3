"""Guards the README and the library page: the quick-start commands are the ones CI
runs, and the library example runs as written."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


def test_quick_start_commands_present_and_ci_runs_the_test_command():
    assert "pip install torch==2.13.0 -e . && tinit variance --layers 80" in README
    test_cmd = 'pip install torch==2.13.0 -e ".[dev,hf,slurm]" && pytest -n 2 --dist loadfile'
    assert test_cmd in README
    assert test_cmd in (ROOT / ".ci" / "run").read_text()


def test_library_example_runs():
    blocks = re.findall(r"```python\n(.*?)```", (ROOT / "docs" / "library.md").read_text(), flags=re.S)
    example = next(b for b in blocks if "run_variance(" in b)
    # same code, smaller sizes so the test stays quick
    example = example.replace("n_layers=80", "n_layers=4").replace(
        "batch=8, seq_len=128", "batch=2, seq_len=16"
    )
    namespace: dict = {}
    exec(compile(example, "docs/library.md", "exec"), namespace)
    result = namespace["result"]
    assert set(result.frames) >= {"variance", "summary"}
    assert len(result["summary"]) == 2
