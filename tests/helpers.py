"""Assertions the CLI tests share: the one-line usage error, and README sections."""

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def readme_section(heading: str) -> str:
    """The README text under ``## <heading>`` up to the next ``## `` heading."""
    text = (ROOT / "README.md").read_text()
    return text.split(f"## {heading}", 1)[1].split("\n## ", 1)[0]


def assert_one_line_error(res, option: str, out: Path | None = None) -> None:
    """Bad input: exit 2, one line on stderr that starts with Error: and names the
    option, no traceback, and (when ``out`` is given) no run folder created."""
    assert res.exit_code == 2, res.output
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error:"), res.stderr
    assert option in lines[0], lines[0]
    assert "Traceback" not in res.output
    if out is not None:
        assert not out.exists()
