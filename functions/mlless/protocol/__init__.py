"""What mlless processes say to each other: frames (`framing` frames them, `fields` and `messages` define them,
`runs` packs an update's indices, `sealing` seals them with the writer's own `identity`), the names of the Redis
keys they are stored under and who may write each (`keys`), and the array layouts of replicas and checkpoints.

A message class registers its frame type with `framing` when it is defined. The package imports `messages` so
that `framing.decode` knows every frame type whichever protocol module a process imports first.
"""
from mlless.protocol import messages

__all__ = ["messages"]
