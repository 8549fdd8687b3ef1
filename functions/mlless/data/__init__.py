"""Datasets: preparation (`mlless prepare`), the on-disk layout, and mini-batch reading."""
