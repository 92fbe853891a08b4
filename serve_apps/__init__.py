"""Ray Serve applications: policy and analyzer deployments, inference backends, weight hot-swap."""
