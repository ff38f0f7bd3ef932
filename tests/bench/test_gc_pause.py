"""The collection-pause bench runs and reports both figures (in a subprocess: it freezes its process)."""

import re
import subprocess
import sys


def test_gc_pause_reports_before_and_after():
    done = subprocess.run([sys.executable, "-m", "bench.gc_pause", "--model", "tiny", "--repeats", "1"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    m = re.search(r"took ([\d.]+) ms over (\d+) objects; after freezing (\d+), ([\d.]+) ms over (\d+)", done.stdout)
    assert m, done.stdout
    assert int(m.group(3)) > 0 and int(m.group(5)) < int(m.group(2))
