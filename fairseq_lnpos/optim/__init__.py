from . import giadam, lr_scheduler, radam  # noqa: F401  (registers `giadam`, `radam`, `warmup_inverse_sqrt`, `step_decay`)
