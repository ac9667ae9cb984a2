"""The errors training raises for problems a user can fix. A leaf: every training module may import it.

train_dalle.py prints each of them as one line (`train_dalle.py: error: ...`), never as a traceback.
"""


class CheckpointError(ValueError):
    """A checkpoint that is missing, unreadable, or does not fit what the caller is using."""


class NonFiniteLossError(RuntimeError):
    """Too many non-finite losses in a row: the run is diverging."""


class MissingTokenizerError(ValueError):
    """The user's own data without a text vocabulary or an image tokenizer: the built-in data's would read it
    wrongly, so the run stops before step 1 and says how to make the missing parts."""
