"""Ray Serve: policy and analyzer deployments, inference backends, weight hot-swap.

See serve_apps/README.md. Light modules (no torch/ray at import): ``config``, ``api``,
``judgment``, ``prompting``, ``weights.manifest``.
"""
