"""The errors training raises for problems a user can fix. A leaf: every training module may import it.

train_dalle.py prints each of them as one line (`train_dalle.py: error: ...`), never as a traceback.
"""


class CheckpointError(ValueError):
    """A checkpoint that is missing, unreadable, or does not fit what the caller is using."""


class NonFiniteLossError(RuntimeError):
    """Too many non-finite losses in a row: the run is diverging."""

