"""What the jobs share: the YAML + override config loader (``config_io``), starting or joining
Ray (``ray_cluster``), offline tiny checkpoints (``tiny_models``), playing single episodes with
retries (``episodes``), and the command line, services and config of the offline commands
(``pipeline``, ``pipeline_config``)."""
