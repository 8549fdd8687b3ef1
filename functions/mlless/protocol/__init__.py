"""Typed frames, the keys they live under, and the array layouts of replicas and checkpoints."""
