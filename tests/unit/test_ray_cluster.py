"""The Ray worker set-up hook that init_ray installs."""

from __future__ import annotations

import importlib
import importlib.util
import logging
import os

from workflows.common.ray_cluster import _NOISY_LOGGERS, WORKER_SETUP_HOOK, noisy_loggers


def test_the_worker_setup_hook_resolves_and_quiets_the_noisy_loggers() -> None:
    module, _, name = WORKER_SETUP_HOOK.rpartition(".")
    hook = getattr(importlib.import_module(module), name)  # a typo would break every worker
    for logger_name in _NOISY_LOGGERS:
        # The installed Ray still has that module: otherwise the hook silences nothing.
        assert importlib.util.find_spec(logger_name) is not None, logger_name
    for path in noisy_loggers().keys() - _NOISY_LOGGERS.keys():
        assert os.path.isfile(path), path  # a logger named by its file: that file must exist
    for logger_name in noisy_loggers():
        logging.getLogger(logger_name).setLevel(logging.NOTSET)
    hook()
    levels = {n: logging.getLogger(n).getEffectiveLevel() for n in noisy_loggers()}
    assert levels == noisy_loggers()


def test_the_hook_silences_only_the_named_dependency_deprecations() -> None:
    import warnings

    from workflows.common.ray_cluster import quiet_worker_logs

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        quiet_worker_logs()
        warnings.warn(
            "`torch.distributed.all_gather_into_tensor` is deprecated. Please use …",
            FutureWarning,
            stacklevel=1,
        )
        warnings.warn("`ExecutionOptions.exclude_resources` is deprecated", UserWarning, 1)
        warnings.warn("something else is deprecated", FutureWarning, stacklevel=1)
    assert [str(w.message) for w in caught] == ["something else is deprecated"]
