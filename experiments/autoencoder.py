"""The reconstruction task: a motion autoencoder with a stated bottleneck and no path around it.

Input and target are the same clean window; the only route from one to the other is the latent,
``latent_dim / stride`` numbers per frame (``model.residual = False``), the size the per-frame PCA
reference gets too. The output is a motion (root trajectory + local joint rotations, exportable as
BVH), scored by FK joint positions.

Variants (``--config experiments/autoencoder.py:VARIANT``), comma-separated:
  ``bandai2`` (default: Bandai-2 with the protocol of docs/protocol.md, seen-pair and unseen-pair
  splits), ``bandai`` (Bandai-1, held-out contents), ``deepmimic`` or ``folder``: the corpus
  (``folder``: your motion files, ``--config.data.source=DIR``, trained as Bandai is: docs/your_data.md);
  ``16``, ``8``, ``4``: numbers per frame (the rate of the rate-distortion table; default 16; the
  table compares them at ``--config.train.steps=3000``);
  ``dynamics``: the dynamics loss on (weight 0.005, blocked Jacobian) and, on Bandai, the 3,000-step
  schedule: the physics-aware objective of the time-to-target comparison (docs/time_to_target.md),
  where the plain way's dense Jacobian costs;
  ``runlocal``: a tiny model and a few steps (seconds; the tests).
"""
from motionjax.configs import base


def get_config(arg: str | None = None):
    parts = [p for p in (arg or "").split(",") if p]
    flags = ("bandai2", "bandai", "deepmimic", "folder", "dynamics", "runlocal")
    unknown = [p for p in parts if p not in flags and not p.isdigit()]
    if unknown:
        raise ValueError(f"unknown config variant {unknown}; expected bandai2|bandai|deepmimic|folder, "
                         "16|8|4, dynamics, runlocal")
    c = base.get_config()
    corpus = next((p for p in ("bandai", "deepmimic", "folder") if p in parts), "bandai2")
    rate = next((int(p) for p in parts if p.isdigit()), 16)  # latent numbers per frame
    if corpus == "folder":  # motion capture like Bandai's: its settings below
        base.use_folder(c, window=64)
    elif corpus == "bandai2":
        base.use_bandai2(c, window=64)
    elif corpus == "bandai":
        # Held-out contents beside the in-distribution splits (docs/models.md "Off the training
        # distribution"); the time-to-target task keeps the splits it was measured on.
        base.use_bandai(c, window=64, ood="dynamics" not in parts)
    if corpus != "deepmimic":
        # 32 windows x 64 frames per step: at equal frames, twice the updates of batch 64 won on
        # validation (2.64 vs 2.83 cm at 800 vs 400 steps).
        c.data.batch_size = 32
        # Augmentation, chosen on validation at 3,000 steps (docs/models.md): mirrored windows (the rig's
        # per-side joint frames mapped by transforms.mirror_frames; 1.42 -> 1.30 cm) played at 0.8-1.25x
        # speed (1.30 -> 1.25 cm).
        c.data.update(mirror_prob=0.5, speed_range=1.25)
    else:
        c.data.batch_size = 32        # DeepMimic: ~1,300 training frames in 32-frame windows
    if corpus == "bandai2":
        # Features whose training std is below 0.05 standardize with 0.05: Bandai-2's leaf joints (hands,
        # toes, head) turn about one axis, so another rig's few degrees off it read as |z| up to 82 and
        # throw the whole encoding off. Chosen on validation (unchanged) and bandai1_validation (a gain on
        # each of three seeds): docs/results.md, "Three seeds with the std floor".
        c.data.std_floor = 0.05
    # Reconstruction: the input is the clean window (no noise, masking or time warp).
    c.data.update(rot_noise=0.0, pos_noise=0.0, joint_mask_prob=0.0, frame_mask_prob=0.0, time_warp=0.0,
                  clean_prob=0.0)
    c.data.chunk = 16 if c.data.window % 16 == 0 else 8
    # A two-stage temporal conv encoder/decoder: 2x then 2x downsampling (stride 4) into `latent_dim`
    # numbers per 4 frames; the coarse stage sees ~2x the span for the same cost. The decoder
    # interpolates between group vectors (no steps between frame groups: jitter 2,322 -> 211 m/s^3,
    # validation 3.21 -> 2.83 cm at 400 steps) and the encoder also sees the FK joint positions
    # (2.83 -> 2.56 cm). Choices on validation, docs/models.md.
    # Width 192 (at learning rate 2e-3, below) on Bandai: validation 1.08 -> 1.01 cm at equal training
    # time (5,500 steps at 0.8x the speed of width 128's 8,000; docs/models.md).
    # Bandai: the decoder also predicts joint positions and the output rotations are their IK projection
    # (model.position_head): validation 1.22 -> 1.03 cm at 3,000 steps. Off on DeepMimic: its knees and
    # elbows are hinges, which the IK reaches only when the rotation head's twists are right.
    c.model.update(name="tconv", dim=128 if corpus == "deepmimic" else 192, depth=1, kernel=5, stride=4,
                   stages=2, latent_dim=4 * rate, residual=False, upsample="interp", input_positions=True,
                   position_head=corpus != "deepmimic", dtype="float32")
    # The pose (root-relative, MPJPE's quantity) carries the weight; the global position term keeps the
    # root trajectory. With position=10 alone, metres of root travel dominated the gradient: 7.69 ->
    # 3.21 cm validation at 400 steps.
    c.loss.update(position=1.0, pose=10.0)
    c.loss.foot = 0.0                 # clean target: skating is scored, not trained
    c.loss.dynamics_weight = 0.0      # see docs/models.md: the dynamics loss did not earn its place
    # Bandai: 9,000 steps of width 192 at 2e-3 with the position head (~24 min at ~6.3 steps/s on 2 quiet
    # cores, inside the 30-minute budget), validation 0.71 cm; without the head 5,500 steps gave 1.01.
    # At 3,000 steps, dropout 0.1 (1.45), width 256 at 3e-3 (1.67), kernel 9 (1.45), depth 2 (1.64),
    # time reversal, and with the head learning rate 3e-3 and a parameter EMA did not help (docs/models.md).
    c.train.update(warmup_steps=100, weight_decay=1e-4, eval_every=500, checkpoint_every=500, references=())
    if corpus != "deepmimic":
        # Muon (train.step.make_optimizer: every weight of rank >= 2, conv kernels as [taps*in, out], at
        # AdamW's update RMS, so AdamW's rate, warmup and cosine carry over): 1.0 cm validation in 1,750
        # steps against AdamW's 4,500 (3 seeds), and 0.42 / 0.83 cm validation / ood_validation against
        # 0.72 / 1.35 at 9,000 steps (docs/time_to_target.md). A step costs 1.12-1.17x AdamW's in the
        # step bench (1.31x in training runs while the trainer held one malloc arena: motionjax/malloc.py).
        c.train.update(steps=9000, learning_rate=2e-3, optimizer="muon")
    else:
        c.train.update(steps=750, learning_rate=3e-3, eval_every=250, checkpoint_every=250)
    c.evals.final.inputs = ("clean",)  # the autoencoder is evaluated on clean input only
    c.evals.clip.noise_level = 0.0
    if "dynamics" in parts:
        c.loss.dynamics_weight = 0.005
        if corpus == "bandai":
            # The time-to-target task keeps the 3,000-step schedule it was measured with (its budget),
            # the model of then (width 128 at 3e-3) and the data of then: no mirroring (Bandai's rig
            # could not be mirrored) or speed change.
            c.train.update(steps=3000, learning_rate=3e-3, optimizer="adamw")
            c.model.update(dim=128, position_head=False)
            c.data.update(mirror_prob=0.0, speed_range=1.0)
    if "runlocal" in parts:
        c.data.batch_size = 8
        # No IK position head and AdamW: the tests' size, where compiling is most of a run (a cold
        # folder run: 69 -> 34 CPU s); the head and Muon have tests of their own (test_models.py,
        # test_train.py).
        c.model.update(dim=16, depth=1, kernel=3, position_head=False)
        c.train.update(steps=6, warmup_steps=2, log_every=1, eval_every=3, checkpoint_every=2,
                       optimizer="adamw", input_check_steps=0)  # the input check compiles a 2nd step
        c.evals.clip.video_s = 0.0  # the tests train many runs: no video each
    return c
