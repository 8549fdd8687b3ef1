"""What mlless processes say to each other: frames (`codec` frames them, `messages` defines them), the names of
the Redis keys they are stored under (`keys`), and the array layouts of replicas and checkpoints.

A message class registers its frame type with the codec when it is defined. The package imports `messages` so
that `codec.decode` knows every frame type whichever protocol module a process imports first.
"""
from mlless.protocol import messages

__all__ = ["messages"]
