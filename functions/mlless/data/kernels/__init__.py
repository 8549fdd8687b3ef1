"""Compiled data kernels (Cython), built by setup.py like the training kernels."""
