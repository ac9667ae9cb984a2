"""Moved: the parity report is `python -m dalle_lab.precision.parity` now (this name keeps old command lines working)."""
if __name__ == "__main__":
    import sys

    from dalle_lab.precision.parity_cli import main

    sys.exit(main())
