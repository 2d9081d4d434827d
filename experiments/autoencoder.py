"""The reconstruction task: a motion autoencoder with a stated bottleneck and no path around it.

Input and target are the same clean window; the only route from one to the other is the latent,
``latent_dim / stride`` numbers per frame (``model.residual = False``), the size the per-frame PCA
reference gets too. The output is a motion (root trajectory + local joint rotations, exportable as
BVH), scored by FK joint positions.

Variants (``--config experiments/autoencoder.py:VARIANT``), comma-separated:
  ``bandai`` (default) or ``deepmimic``: the corpus;
  ``16``, ``8``, ``4``: numbers per frame (the rate of the rate-distortion table; default 16);
  ``runlocal``: a tiny model and a few steps (seconds; the tests).
"""
from experiments import base


def get_config(arg: str | None = None):
    parts = [p for p in (arg or "").split(",") if p]
    unknown = [p for p in parts if p not in ("bandai", "deepmimic", "runlocal") and not p.isdigit()]
    if unknown:
        raise ValueError(f"unknown config variant {unknown}; expected bandai|deepmimic, 16|8|4, runlocal")
    c = base.get_config()
    corpus = "deepmimic" if "deepmimic" in parts else "bandai"
    rate = next((int(p) for p in parts if p.isdigit()), 16)  # latent numbers per frame
    if corpus == "bandai":
        base.use_bandai(c, window=64)
        c.data.batch_size = 64        # 64 windows x 64 frames per step
    else:
        c.data.batch_size = 32        # DeepMimic: ~1,300 training frames in 32-frame windows
    # Reconstruction: the input is the clean window (no noise, masking or time warp).
    c.data.update(rot_noise=0.0, pos_noise=0.0, joint_mask_prob=0.0, frame_mask_prob=0.0, time_warp=0.0,
                  clean_prob=0.0)
    c.data.chunk = 16 if c.data.window % 16 == 0 else 8
    # A two-stage temporal conv encoder/decoder: 2x then 2x downsampling (stride 4) into `latent_dim`
    # numbers per 4 frames; the coarse stage sees ~2x the span for the same cost.
    c.model.update(name="tconv", dim=128, depth=1, kernel=5, stride=4, stages=2, latent_dim=4 * rate,
                   residual=False, dtype="float32")
    c.loss.foot = 0.0                 # clean target: skating is scored, not trained
    c.loss.dynamics_weight = 0.0      # see docs/models.md: the dynamics loss did not earn its place
    # 1,200 steps: 26 min on the shared 2-core host (load ~12), validation still falling at the end
    # (7.7 / 6.0 / 5.2 cm at steps 400 / 800 / 1,200): compute-bound, see docs/models.md.
    c.train.update(steps=1200, learning_rate=3e-3, warmup_steps=100, weight_decay=1e-4, eval_every=400,
                   checkpoint_every=400, references=())
    c.train.eval_noise_level = 0.0    # the autoencoder is evaluated on clean input only
    if corpus == "deepmimic":
        c.train.update(steps=750, eval_every=250, checkpoint_every=250)
    if "runlocal" in parts:
        c.data.batch_size = 8
        c.model.update(dim=16, depth=1, kernel=3)
        c.train.update(steps=6, warmup_steps=2, log_every=1, eval_every=3, checkpoint_every=2)
    return c
