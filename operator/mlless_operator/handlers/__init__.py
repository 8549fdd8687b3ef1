"""Kopf handler bodies, one module per entry point of `mlless_operator.main`, which only registers them.

Handlers are leaves: none imports another; what several of them need is in `mlless_operator.reconcile`.
"""
