"""Worker processes freeze their start-up objects: a full collection then walks only what came after.
Run in a subprocess, so that the test process itself is not frozen."""

import subprocess
import sys

SCRIPT = """
import gc
from engine.gc_freeze import freeze_startup_objects
startup = [[i] for i in range(50_000)]  # stand-ins for a loaded engine's objects
before = len(gc.get_objects())
frozen = freeze_startup_objects()
after = len(gc.get_objects())
assert frozen == gc.get_freeze_count() >= 50_000, frozen
assert after < before - 50_000, (before, after)  # a full collection no longer walks them
later = [[i] for i in range(10)]
assert any(o is later for o in gc.get_objects())  # objects made afterwards are still collected as usual
del startup  # and frozen objects are still freed by reference counting
print("ok")
"""


def test_startup_objects_leave_the_collectors_walk():
    done = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"
