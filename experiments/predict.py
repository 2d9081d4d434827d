"""Motion forecasting: the past 2 s of a window in, the next second out (a motion on the true bones).

Each training window holds ``P + F`` frames; the model sees the first ``P = data.observed`` (its input's
later frames hold the last observed pose, and the window's floor comes from the observed frames, so
nothing of the future leaks in) and the loss scores the ``F`` predicted ones (and the seam before
them: :func:`motionjax.data.transforms.forecast_frames`). The output is the whole window, a root
trajectory and local rotations decoded by FK on the clip's bones (exportable as BVH, evals.clip).

The model is a siMLPe-style forecaster (``model.name = "dct_mlp"``,
:class:`motionjax.models.DCTPredictor`: a DCT over the observed frames, linear maps over the
coefficient axis with layer norm over the feature axis, the residual to the last observed pose)
whose forecast keeps only the 20 lowest DCT frequencies (``model.dct_keep``): 64,609 parameters on
Bandai. The evaluator (``evals.forecast``) prints the horizon table (MPJPE at 80 / 160 / 320 / 400 /
560 / 1000 ms and over the predicted second, then foot skating, floor penetration, jitter, bone
error and the generalized forces ``Jᵀ m (a − g)``) with the siMLPe-style reference, the
zero-velocity and constant-velocity baselines and the truth's own plausibility beside the model
(docs/prediction.md).

Variants (``--config experiments/predict.py:VARIANT``), comma-separated:
  ``bandai2`` (default: Bandai-2 with the protocol of docs/protocol.md, seen-pair and unseen-pair
  splits), ``bandai`` (Bandai-1) or ``deepmimic``: the corpus (Bandai: 60 observed + 30 predicted
  frames at 30 fps; DeepMimic's short segments: 20 + 12 frames in its 32-frame windows); ``folder``:
  your motion files (``--config.data.source=DIR``), as Bandai (docs/your_data.md);
  ``long``: Bandai, 2 s predicted (60 + 60 frames; the 2 s horizon is scored too);
  ``simlpe``: the siMLPe-style reference alone (every DCT frequency of the forecast kept; the default
  run trains it beside the model, ``train.reference_models``);
  ``dynamics``: the dynamics loss on (weight 0.005, blocked Jacobian), with a no-dynamics reference run;
  ``alone``: the model without the siMLPe-style reference run beside it (sweeps);
  ``runlocal``: a tiny model and a few steps (seconds; the tests).
"""
import ml_collections

from motionjax.configs import base

FLAGS = ("bandai2", "bandai", "deepmimic", "folder", "long", "simlpe", "dynamics", "alone", "runlocal")


def get_config(arg: str | None = None):
    parts = [p for p in (arg or "").split(",") if p]
    unknown = [p for p in parts if p not in FLAGS]
    if unknown:
        raise ValueError(f"unknown config variant {unknown}; expected some of {FLAGS}")
    c = base.get_config()
    corpus = next((p for p in ("bandai", "deepmimic", "folder") if p in parts), "bandai2")
    if corpus == "deepmimic":
        if "long" in parts:
            raise ValueError("variant 'long' needs Bandai (DeepMimic's segments are shorter than 2 s + 2 s)")
        c.data.update(window=32, chunk=8, observed=20)  # base's prepared DeepMimic windows
    else:
        future = 60 if "long" in parts else 30  # frames at 30 fps: 2 s or 1 s
        use = {"folder": base.use_folder, "bandai": base.use_bandai, "bandai2": base.use_bandai2}[corpus]
        use(c, window=60 + future)
        c.data.update(chunk=30, observed=60)
        c.data.update(mirror_prob=0.5, speed_range=1.25)  # the autoencoder's augmentation (docs/models.md)
    c.data.batch_size = 32
    # The input is the observed motion itself: no noise, masking or time warp.
    c.data.update(rot_noise=0.0, pos_noise=0.0, joint_mask_prob=0.0, frame_mask_prob=0.0, time_warp=0.0,
                  clean_prob=0.0)
    c.data.eval_stride = 8 if corpus == "deepmimic" else 15
    # siMLPe's trunk (temporal FCs over the DCT of the observed frames, layer norm over features, the residual
    # to the last pose). Chosen on Bandai validation at 300 steps (docs/prediction.md, MPJPE over the
    # predicted second): keeping the 20 lowest of the 60 DCT frequencies of the forecast (model.dct_keep: a
    # third of them, up to 5 Hz) 4.40 -> 4.21 cm, better at every horizon, jitter 2,413 -> 290 m/s^3,
    # skating 48 -> 34 cm/s;
    # FK joint positions as inputs and a feature MLP per block (mlp_ratio 2, 604k parameters instead of 65k)
    # 4.21 -> 5.04 cm and 2.6x slower per step.
    plain = "simlpe" in parts
    c.model.update(name="dct_mlp", dim=128, depth=8, mlp_ratio=0, input_positions=False,
                   dct_keep=0 if plain else c.data.observed // 3, dropout=0.0, dtype="float32", stride=1)
    # Pose (MPJPE's quantity) and the root trajectory, as in the autoencoder; skating is scored, not trained.
    # The dynamics loss stays off: at weight 5 (3 seeds on validation) jitter -40-51%, skating -10-17%, MPJPE
    # at 1 s +7-10%; the foot term at 1.0: skating -40%, MPJPE at 1 s +14% (docs/prediction.md).
    c.loss.update(rotation=1.0, position=1.0, pose=10.0, foot=0.0, dynamics_weight=0.0)
    # Two models train in the default run (the model and the siMLPe-style reference, below): 2,000 steps
    # each at the 2.8-4.5 steps/s measured on the shared 2-core machine (the loader is the bottleneck:
    # 70-77% data wait) is 7-12 min each, with the evaluations inside 30 minutes.
    c.train.update(steps=2000, learning_rate=1e-3, warmup_steps=100, weight_decay=1e-4, eval_every=500,
                   checkpoint_every=500, references=())
    if corpus == "deepmimic":
        c.train.update(steps=1000, eval_every=250, checkpoint_every=250)
    if not plain and "alone" not in parts:
        # The siMLPe-style reference, same data, loss and steps: every DCT frequency, as siMLPe.
        c.train.reference_models.simlpe = dict(dct_keep=0)
    horizons = (80, 160, 320, 400, 560, 1000) + ((2000,) if "long" in parts else ())
    # Bandai-2: the seen-pair and unseen-pair splits of use_bandai2 (the best checkpoint by their mean).
    heldout, final = tuple(c.evals.heldout.splits), tuple(c.evals.final.splits)
    if corpus != "bandai2":
        heldout, final = ("validation",), ("train", "validation", "test")
    c.evals = ml_collections.ConfigDict()
    c.evals.heldout = dict(kind="forecast", splits=heldout, horizons_ms=horizons, during=True)
    c.evals.final = dict(kind="forecast", splits=final, horizons_ms=horizons)
    c.evals.clip = dict(kind="clip", split="test", noise_level=0.0, video_s=0.0)
    if corpus == "bandai2":
        base.cross_corpus(c)  # Bandai-1's walk and run, and all of it: the cross-corpus test
    if "dynamics" in parts:
        c.loss.dynamics_weight = 0.005
        c.train.references = ("no_dynamics",)
    if "runlocal" in parts:
        c.data.batch_size = 8
        c.model.update(dim=16, depth=2)
        c.train.update(steps=6, warmup_steps=2, log_every=1, eval_every=3, checkpoint_every=2)
    return c
