"""`python -m cvae.cli`: the `cvae` command (cvae/training/launch.py starts its processes so)."""

import sys

from cvae.cli.main import main

sys.exit(main())
