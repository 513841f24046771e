from . import lr_scheduler, radam  # noqa: F401  (registers `radam`, `warmup_inverse_sqrt`, `step_decay`)
