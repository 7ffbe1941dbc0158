"""examples/python runs and prints what it says it prints (a smoke test: its figures are seeded)."""

import re
import runpy
from pathlib import Path

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "python"


def test_decode_step_example(capsys):
    runpy.run_path(str(EXAMPLES / "decode_step.py"), run_name="__main__")
    out = capsys.readouterr().out
    assert "rows fetched: 256 of 3226 cached rows (7.9%)" in out
    m = re.search(r"attention mass on the fetched rows: ([0-9.]+) \(as many rows chosen at "
                  r"random: ([0-9.]+)\)", out)
    assert m and float(m.group(1)) > 2 * float(m.group(2))
