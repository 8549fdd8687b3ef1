"""What the handlers share: idempotent steps that read and change the cluster (through `kubeapi`).

Handlers call these; these call builders, `kubeapi` and `conditions`, never a handler.
"""
