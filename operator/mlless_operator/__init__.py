"""The mlless Kopf operator: turns a TrainingJob into Redis, RabbitMQ, a supervisor and worker functions.

`kopf run -m mlless_operator` imports this package and nothing else, so the
package registers the handlers itself, by importing `mlless_operator.main`:
that command, `kopf run -m mlless_operator.main` (the chart's) and
`python -m mlless_operator` all start the same operator (Python imports
`main` once, so no handler registers twice).
"""
from mlless_operator import main  # registers the Kopf handlers

__all__ = ["main"]
