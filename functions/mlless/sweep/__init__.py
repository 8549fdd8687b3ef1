"""Hyperparameter sweeps: trials of one TrainingJob template over a search space, losers stopped early by ASHA."""
