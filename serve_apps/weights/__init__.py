"""Weight hot-swap: shard format, the registry actor, the trainer-side publisher and the
replica-side follower. Import the submodule you need (this package imports nothing heavy):

- ``serve_apps.weights.publisher``: ``WeightPublisher``, ``publish_weights``,
  ``wait_for_version``, ``replica_versions`` (trainer, job, tests, benchmarks)
- ``serve_apps.weights.registry``: the ``WeightRegistry`` actor
- ``serve_apps.weights.follower``: what each replica runs
"""
