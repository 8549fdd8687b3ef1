"""Kopf handler bodies, one module per concern; `mlless_operator.main` only registers them."""
