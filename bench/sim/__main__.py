import sys

from bench.sim.cli import main

sys.exit(main())
