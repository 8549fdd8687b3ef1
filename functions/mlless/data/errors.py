"""The error `mlless prepare` raises when it cannot proceed, below every reader so that each can raise it."""


class PrepareError(ValueError):
    """Preparation cannot proceed (bad option, bad input); the message says why."""
