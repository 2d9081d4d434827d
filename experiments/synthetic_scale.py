"""Scaling run on the procedural corpus (any size, generated on the fly): a wider, deeper model,
longer windows split over a ``(data, time)`` mesh. Sized for accelerators; on CPU use overrides
such as ``--config.train.steps=20``."""
from motionjax.configs import base


def get_config(arg: str | None = None):
    c = base.get_config()
    c.data.source = "synthetic"
    c.data.window = 128
    c.data.chunk = 16
    c.data.batch_size = 256
    c.model.update(dim=256, depth=4, heads=8, halo=8, latent_dim=64, stride=4)
    c.mesh.shape = (("data", -1), ("time", 2))
    c.train.update(steps=20_000, learning_rate=5e-4, warmup_steps=500, eval_every=2000, checkpoint_every=1000,
                   references=())
    # No PCA reference: it would be fitted on every frame of the 128k training clips.
    c.evals.final.update(splits=("validation",), references=("input",), by_label=False)
    c.evals.clip.split = "validation"
    if arg is not None:
        raise ValueError(f"unknown config variant {arg!r}")
    return c
