import sys

from baton.perf.sim.cli import main

sys.exit(main())
