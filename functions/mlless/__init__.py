"""mlless: serverless machine-learning training (MLLess) with a supervisor and worker functions."""

__version__ = "0.1.0"
