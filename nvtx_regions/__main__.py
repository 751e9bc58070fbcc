"""``python -m nvtx_regions``: the ``nvtx-regions`` command line (`commands.main`)."""

import sys

from .commands.main import main

if __name__ == "__main__":
    sys.exit(main())
