"""Moved: the parity report is `python -m dalle_lab.precision.parity` now (this name keeps old command lines working)."""
import sys

from dalle_lab.precision.parity import main

if __name__ == "__main__":
    sys.exit(main())
