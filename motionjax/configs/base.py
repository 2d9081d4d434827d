"""Shared base config; experiments import ``get_config`` from here and override a few fields.

Every knob the code reads lives here (library code reads config keys without defaults of its own, so
a key missing here is an error, not a silent default). Sections:
``data`` (motionjax.data), ``model`` (motionjax.models), ``loss`` (motionjax.losses and the
dynamics terms), ``mesh`` (motionjax.parallel), ``train`` (motionjax.train), ``evals``
(motionjax.evaluation.evaluators).
"""
import ml_collections

from motionjax.core import dynamics
from motionjax.data import DEEPMIMIC_SPLITS


def get_config() -> ml_collections.ConfigDict:
    c = ml_collections.ConfigDict()
    c.seed = 0

    c.data = ml_collections.ConfigDict()
    c.data.source = "deepmimic"        # "deepmimic" (pybullet), "synthetic", or a dir/glob of motion files
    # Prepared shards + index.json + stats (made on first use). "_clean": prepared with data.clean = "repair";
    # a directory prepared before cleaning existed holds other settings and is refused, not overwritten.
    c.data.dir = "data_cache/deepmimic_clean"
    c.data.loader = "grain"            # "grain" (data.pipeline) | "naive" (baseline: numpy, main thread)
    c.data.fps = 30.0                  # every clip is resampled to this rate
    c.data.window = 32                 # frames per window (T); 64 exceeds most DeepMimic train segments
    c.data.chunk = 8                   # frames per time chunk (C); T = N*C, N divisible by the 'time' axis
    c.data.batch_size = 32             # global batch (windows), split evenly over processes
    # "memory": the largest batch whose train step fits device memory; "throughput": the fastest that
    # fits (motionjax.train.batch_finder, run by the trainer before its first step); replaces batch_size.
    c.data.auto_batch = ""
    # Where the training corpus lives (motionjax.data.feed): "device" (frames on every device once; windows
    # drawn, gathered and augmented there: the host moves nothing per step), "stream" (Grain reads records
    # through a host cache and ships each window's frames; the device augments), "auto" (device when it fits).
    c.data.residency = "auto"
    c.data.device_share = 0.25         # the share of one device's memory a resident corpus may take
    c.data.host_cache_mb = 2048.0      # "stream": decoded segments kept in host RAM (per worker process)
    # "stream": Grain worker processes; 0 = in the main process; -1 = measured at start (feed.auto_workers)
    c.data.worker_count = -1
    c.data.worker_buffer = 2           # batches each worker keeps ready
    c.data.prefetch = 2                # batches prefetched by a host thread, then again on device
    # "stream": batches a Grain element carries (one draw, one transfer; the fed step indexes its batch):
    # a Python call's fixed cost shared by that many steps (docs/input.md, "Fourteenth pass"). 1 with
    # loss-aware sampling, whose next windows wait for the last step's errors.
    c.data.stream_block = 8
    c.data.dynamics_sampling = 0.5     # window sampling: weight of the accel/jerk score vs uniform
    # Loss-aware sampling (motionjax.data.priority): weight of each segment's latest window error in the
    # draw, against the share above; 0 = off. Every segment keeps at least (1 - this) of its share.
    c.data.loss_sampling = 0.0
    c.data.loss_block = 250            # steps drawn from one snapshot of the error table
    c.data.loss_staleness = 2000       # steps: an older error counts as unknown (the mean); 0 = never stale
    c.data.strict = False              # True: a bad file/record raises instead of being skipped+counted
    # Corpus conventions (motionjax.data.corpus); a change needs a new data.dir (prepared data is immutable).
    c.data.units = "auto"              # "auto" (from bone lengths) | "m" | "cm" | "mm" | "inch"
    c.data.up_axis = "auto"            # "auto" (the files': y for BVH/DeepMimic) | "x" | "y" | "z"
    c.data.dedup = True                # drop copies of a take; near-identical clips stay in one split
    # Copies: clips whose moving windows (idle ones are no evidence) lie within this RMS joint distance (m)
    # of another clip's, over 80% of them (motionjax.data.dedup.COPY_M: calibrated on Bandai-1, where
    # different files' moving windows are >= 3.3 cm apart and a copy with 3 mm noise is <= 1.03 cm off).
    c.data.copy_threshold = 0.012
    c.data.dedup_policy = "copies"     # "copies": drop copies only | "prune": also similar takes (opt-in)
    c.data.near_threshold = 0.02       # m: RMS window distance of similar takes (dedup_policy="prune")
    c.data.prepare_workers = 2         # processes converting files at prepare time
    # Corrupted frames in well-formed clips (motionjax.data.clean): "repair" interpolates defects of at most
    # clean_limits.repair_frames frames and cuts longer ones (a clip becomes its good spans); "report" only
    # lists them (cleaning.json beside index.json); "off" skips the detectors. Defaults from Bandai-1's 174
    # clips (docs/data.md "Cleaning": each bound is the corpus's largest value times a stated margin).
    c.data.clean = "repair"
    c.data.clean_limits = ml_collections.ConfigDict()
    c.data.clean_limits.pop_m = 0.25           # m: 1-3 frames of a joint this far from the cubic across them
    c.data.clean_limits.twist_rad = 1.5        # rad: a joint rotating this much in one frame (a flip/twist)
    c.data.clean_limits.twist_frames = 60      # frames: a twist or root jump undone within this is one range
    c.data.clean_limits.teleport_m = 0.12      # m: a root step this far from its 7-frame median (a jump)
    c.data.clean_limits.frozen_frames = 8      # frames: this many identical frames in a row are a freeze
    c.data.clean_limits.stretch_m = 0.01       # m: position channels this far from their median (stretch)
    c.data.clean_limits.penetration_m = 0.14   # m: lowest joint this far below the clip's floor
    c.data.clean_limits.float_m = 0.25         # m: lowest joint this far above the floor ...
    c.data.clean_limits.float_s = 1.0          # s: ... for longer than this is floating
    c.data.clean_limits.repair_frames = 5      # defects up to this many frames are interpolated, longer cut
    c.data.clean_limits.min_kept = 0.5         # a clip keeping less than this share of its frames is dropped
    # Split rules (motionjax.data.corpus): "rest" (train), "clips:a,b", "pattern:GLOB", "label:K=V",
    # "stratified:KEY:FRACTION[:seed=N]", "tail:FRACTION". DeepMimic: three clips never trained on
    # (each has a sibling motion in training) are the test split; the last 20% of the others validate.
    c.data.splits = ml_collections.ConfigDict(DEEPMIMIC_SPLITS)
    # Forecasting (experiments/predict.py): the model observes the first `observed` frames of each window
    # (its input's later frames hold the last observed one) and the loss scores the rest; 0 = every frame.
    c.data.observed = 0
    c.data.eval_stride = 16            # frames between eval windows (make_eval_batches)
    # >0: features whose training std is below this standardize with it instead (channels that barely move
    # in training, e.g. toes, would otherwise amplify any motion they make on new data by 1/std).
    c.data.std_floor = 0.0
    c.data.floor_align = True          # lowest joint of each window at height 0
    c.data.canonical_height = 0.0      # >0: retarget bodies to this standing root height (m); 0 = off
    # "clip": each window carries its clip's rest offsets (batch["offsets"] [B, J, 3]) and FK in the
    # losses and metrics runs on them (several performers in one corpus: the motion as recorded);
    # "canonical": every clip on the dataset skeleton (the per-joint median bones; no batch["offsets"]).
    c.data.bones = "clip"
    c.data.rot_noise = 0.05            # tangent-space rotation noise std per axis (rad) on the noisy input
    c.data.pos_noise = 0.02            # root position noise std per axis (m)
    c.data.joint_mask_prob = 0.05      # chance a (frame, joint) rotation is masked in the noisy input
    c.data.frame_mask_prob = 0.05      # chance a whole frame is masked (batch["mask"] = 1 there)
    c.data.time_warp = 1.5             # max time-warp jitter shift (frames) of the noisy input
    c.data.mirror_prob = 0.5           # chance a window is mirrored left/right (clean and noisy alike)
    c.data.clean_prob = 0.0            # chance a window's input is left clean (denoiser learns to keep it)
    c.data.speed_range = 1.0           # >1: each training window plays at a speed in [1/r, r] (log-uniform)
    c.data.reverse_prob = 0.0          # chance a training window plays backwards (time reversed)
    c.data.pose_offset = 0.0           # >0: each training window's joints turned by one N(0, this) rad offset
    c.data.synthetic_clips = 128_000   # source="synthetic": corpus size (generated on the fly, never stored)
    c.data.synthetic_frames = 240      # frames per synthetic clip
    c.data.synthetic_seed = 0          # synthetic clip i is a function of (synthetic_seed, i)

    c.model = ml_collections.ConfigDict()
    c.model.name = "transformer"       # "transformer" | "tconv"
    c.model.dim = 128                  # per-frame embedding width
    c.model.depth = 1                  # blocks before and after the bottleneck (each)
    c.model.heads = 4                  # attention heads (transformer)
    c.model.mlp_ratio = 2              # MLP hidden width / dim (transformer)
    c.model.halo = 4                   # frames of each neighbouring chunk a block sees (transformer)
    c.model.kernel = 9                 # temporal conv width (tconv); its halo is kernel // 2 frames
    c.model.stride = 2                 # frames pooled into one latent vector; divides data.chunk
    c.model.latent_dim = 32            # latent width per `stride` frames (latent_dim / stride per frame)
    c.model.residual = False           # True: predict a correction to the input (bypasses the bottleneck)
    c.model.stages = 1                 # stride split over this many down/upsampling stages (stride^(1/n))
    c.model.upsample = "linear"        # "linear": a vector -> k frames by a linear map | "interp": linear
                                       # interpolation between group vectors (smooth across groups)
    c.model.input_positions = False    # the encoder also sees its input's root-relative FK joint positions
    c.model.global_rotations = False   # the head predicts window-frame rotations; local ones follow exactly
    c.model.position_head = False      # the head also predicts joint positions; rotations: IK onto them
    c.model.highpass = 0               # residual only: the correction sees x - its moving average over this
                                       # many frames (odd; 0 = x itself), so it cannot memorize poses
    c.model.dct_keep = 0               # dct_mlp: lowest DCT coefficients of the forecast kept (0 = all)
    c.model.dropout = 0.0
    c.model.dtype = "bfloat16"         # activation/compute dtype
    c.model.param_dtype = "float32"    # parameter (and optimizer state) dtype

    c.loss = ml_collections.ConfigDict()
    c.loss.jacobian = "blocked"        # "blocked" | "jvp" | "dense"
    c.loss.rotation = 1.0              # weight of the rotation term, mean (1 - cos angle) per joint
    c.loss.position = 10.0             # weight of the FK position term, mean joint error (m)
    c.loss.pose = 0.0                  # weight of the root-relative FK position error (m), MPJPE's quantity
    c.loss.foot = 0.1                  # weight of foot skating: foot speed^2 where the truth is planted
    c.loss.contact_speed = 0.3         # m/s: a slower true foot is planted (loss and foot-skate metric)
    c.loss.dynamics_weight = 1.0       # weight of motionjax.core.dynamics.dynamics_loss (0 disables it)
    # dynamics_loss term weights (velocity, force, jerk); the defaults and their magnitudes: dynamics.py
    c.loss.dynamics = ml_collections.ConfigDict(dynamics.DEFAULT_WEIGHTS)

    c.mesh = ml_collections.ConfigDict()
    c.mesh.shape = (("data", -1), ("time", 1))  # -1 fills with the remaining devices
    c.mesh.across_hosts = "data"       # with several processes this axis spans them (hybrid mesh)
    c.mesh.fsdp = False                # split each parameter's largest dim over 'data' instead of replicating

    c.train = ml_collections.ConfigDict()
    c.train.steps = 1000
    c.train.optimizer = "adamw"        # or "lion", "muon", "schedule_free" (train.step.make_optimizer)
    c.train.learning_rate = 1e-3       # peak learning rate
    c.train.warmup_steps = 50          # linear warmup (optimizer updates), then cosine decay
    c.train.final_lr_fraction = 0.05   # cosine ends at this fraction of the peak
    c.train.b1 = 0.9
    c.train.b2 = 0.99
    c.train.weight_decay = 1e-4
    c.train.grad_clip = 1.0            # global-norm clipping
    c.train.ema_decay = 0.0            # >0: evaluate (and export) an exponential moving average of the params
    c.train.grad_accum_steps = 1       # >1: optax.MultiSteps averages this many micro-batches per update
    # >1: each step runs its batch as this many slices one after another (a slice's activations in
    # memory) and reduces the summed gradient once (train.step.accumulate); grad_accum_steps reduces
    # every micro-batch.
    c.train.micro_batches = 1
    # The gradient sum over 'data' (motionjax.train.grad_reduce): wire format "fp32" (XLA's exact
    # all-reduce), "bf16" or "int8" (block scales, error feedback kept in the train state).
    c.train.grad_reduce = "fp32"
    c.train.grad_reduce_levels = 1     # 2: reduce-scatter inside each host, the 1/d slices across, all-gather
    c.train.grad_reduce_host_size = 0  # 'data' devices per host for 2 levels; 0 = those of one process
    # fp32 two-level, across hosts: True sums each slice on its owner in device order (the same bits
    # however the devices are spread over processes; one more collective per bucket), False a psum.
    # bf16/int8 are always summed in device order.
    c.train.grad_reduce_ordered = False
    c.train.grad_bucket_mb = 4.0       # explicit reductions: leaves summed in buckets of about this (fp32)
    c.train.max_nonfinite_steps = 5    # this many non-finite steps in a row restore the last checkpoint
    c.train.log_every = 10             # steps between train-metric logs
    c.train.progress_every = 100       # no terminal (a log file, CI): a progress line every this many steps
    c.train.input_check_steps = 40     # fed vs fixed-batch steps after training, 8 rounds (input overhead)
    c.train.eval_every = 200           # steps between held-out evaluations (and best-checkpoint candidates)
    c.train.checkpoint_every = 100     # steps between checkpoints
    c.train.keep_checkpoints = 2       # last N checkpoints kept (plus the best by held-out MPJPE)
    c.train.stop_timeout_s = 60.0      # after SIGTERM/SIGINT the process exits within this, saved or not
    # JAX's persistent compilation cache (motionjax.train.compile_cache): a rerun or resume of this config
    # loads its compiled programs instead of compiling them again. "" = off; JAX_COMPILATION_CACHE_DIR wins.
    c.train.compile_cache = "~/.cache/motionjax/jax"
    # SPLIT/METRIC of a `during` evaluator (SPLIT+SPLIT/METRIC: their mean); lowest = best checkpoint.
    c.train.best_metric = "validation/mpjpe"
    c.train.references = ("no_dynamics",)  # also train the same model without the dynamics loss
    # NAME: {model key: value}: also train that model (same data, loss and steps) in workdir/NAME; its rows
    # join the results table as NAME (experiments/predict.py: the siMLPe-style reference).
    c.train.reference_models = ml_collections.ConfigDict()

    # Evaluators (motionjax.evaluation.evaluators), big_vision style: NAME = {kind, settings}. Every one
    # runs once at the end (the test split only there: nothing is chosen on it); `during` ones also run
    # every train.eval_every steps (learning curves; train.best_metric among them picks the checkpoint).
    c.evals = ml_collections.ConfigDict()
    c.evals.heldout = dict(kind="metrics", splits=("validation",), inputs=("clean",), during=True)
    # noise_level: the corruption of the "noisy" input, as a multiple of the training noise (data.*_noise).
    c.evals.final = dict(kind="metrics", splits=("train", "validation", "test"), inputs=("clean", "noisy"),
                         noise_level=1.0, references=("input", "pca"), by_label=True)
    # Skeleton figure + BVH of one window; up to video_s seconds of its clip as heldout_clip.mp4 (0: none).
    c.evals.clip = dict(kind="clip", split="test", noise_level=1.0, video_s=10.0)
    return c


# The Bandai Namco Research Motion Dataset 1 (CC BY-NC 4.0; Kobayashi et al., arXiv:2306.08861):
# 174 BVH clips, centimetres, a placeholder root, content/style labels. Not in this repository:
# ../shared/data/bandai-namco-1 in the development checkout; elsewhere point data.source at a copy.
BANDAI_SOURCE = "../shared/data/bandai-namco-1/data"


# A folder of your own motion files (docs/your_data.md): the config variants ``folder`` of
# experiments/autoencoder.py and experiments/predict.py; --config.data.source=DIR names it.
FOLDER_SPLITS = {"train": "rest", "validation": "stratified:content:0.1", "test": "stratified:content:0.1"}


# Contents never trained on (docs/models.md "Off the training distribution"): each set is one
# everyday gesture (15 clips, one per style) and the rarest combat and reply contents (1-2 clips), so
# the two are alike in kind and disjoint; the mirrored pair walk-left/walk-right stays in training.
BANDAI_OOD = {"ood_validation": "label:content=guide,punch,kick",
              "ood_test": "label:content=bow,slash,respond"}


# The Bandai Namco Research Motion Dataset 2 (CC BY-NC 4.0; same publisher, paper and skeleton as Bandai-1):
# 2,602 BVH clips, 10 contents x 7 styles, ~37 takes per (content, style) pair. The archive is read in place
# (checked against SHA256SUMS and unpacked once into data_cache/sources/: motionjax.data.archive); not in
# this repository. Elsewhere point data.source at a copy of the archive or of its unpacked data/ folder.
BANDAI2_SOURCE = "../shared/data/bandai-namco-2/data.tar.xz"

# The protocol (docs/protocol.md): whole (content, style) pairs never trained on, taken before the
# seen-pair splits draw ~10% of the takes of every other pair for validation and ~10% for test. Each
# unseen set mixes locomotion and gestures; the two are disjoint and neither removes a content or a
# style from training (every content and style still trains in its other pairs).
BANDAI2_UNSEEN = {
    "unseen_validation": "label:content+style=walk-turn-right+normal,raise-up-right-hand+elderly,"
                         "wave-left-hand+feminine",
    "unseen_test": "label:content+style=walk+elderly,walk-turn-left+feminine,run+exhausted,"
                   "wave-both-hands+youthful,raise-up-left-hand+masculine,wave-right-hand+active"}
BANDAI2_SPLITS = {"train": "rest", "validation": "stratified:content+style:0.1",
                  "test": "stratified:content+style:0.1"}


def use_folder(c: ml_collections.ConfigDict, window: int | None = None) -> ml_collections.ConfigDict:
    """Point ``c.data`` at a folder of motion files (BVH, DeepMimic), given on the command line
    (``--config.data.source=DIR``; until then empty, which the trainer refuses with that hint): whole
    clips drawn for ~10% validation and ~10% test (per ``content`` label where clips have label
    sidecars, else at random: :data:`FOLDER_SPLITS`). The prepared directory is
    ``data_cache/folder_w<window>[_clean]`` (another folder there replaces it: give each corpus its own
    ``--config.data.dir`` to keep several)."""
    if window is not None:
        c.data.window = window
    c.data.source = ""
    c.data.dir = f"data_cache/folder_w{c.data.window}" + ("_clean" if c.data.clean == "repair" else "")
    c.data.splits = ml_collections.ConfigDict(FOLDER_SPLITS)
    return c


def use_bandai(c: ml_collections.ConfigDict, window: int | None = None, ood: bool = False
               ) -> ml_collections.ConfigDict:
    """Point ``c.data`` at Bandai-1: clips stratified by content, ~10% validation, ~10% test.

    ``ood``: also hold out whole contents (:data:`BANDAI_OOD`) as ``ood_validation`` and
    ``ood_test``, taken before the stratified splits draw from the rest; the held-out evaluators
    score both validation splits and the best checkpoint is chosen by their mean MPJPE.

    The prepared directory is named by the window (its feature statistics are per window) and the
    split protocol, so configs with other windows or splits never share one."""
    if window is not None:
        c.data.window = window
    c.data.source = BANDAI_SOURCE
    # Cleaning changes what is kept: a cleaned directory is named apart from the uncleaned ones that runs
    # trained before cleaning existed restore their data from (their config.json names those).
    c.data.dir = (f"data_cache/bandai1_w{c.data.window}" + ("_ood" if ood else "")
                  + ("_clean" if c.data.clean == "repair" else ""))
    held_out = BANDAI_OOD if ood else {}
    c.data.splits = ml_collections.ConfigDict({"train": "rest", **held_out,
                                               "validation": "stratified:content:0.1",
                                               "test": "stratified:content:0.1"})
    if ood:
        c.evals.heldout.splits = ("validation", "ood_validation")
        c.evals.final.splits = ("train", "validation", "ood_validation", "test", "ood_test")
        # In- and out-of-distribution validation weigh the same: a checkpoint that fits Bandai-1's own
        # contents better but new ones worse is not chosen for free.
        c.train.best_metric = "validation+ood_validation/mpjpe"
    return c


# The cross-corpus test of a Bandai-2 run (docs/protocol.md): Bandai-1's takes of the two contents both
# corpora have (walk and run: 30 clips), and all of Bandai-1 (174 clips, 17 contents), every clip scored.
BANDAI1_CROSS = {"bandai1_walk_run": tuple(f"{BANDAI_SOURCE}/dataset-1_{k}_*.bvh" for k in ("walk", "run")),
                 "bandai1_all": (BANDAI_SOURCE,)}


def cross_corpus(c: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
    """Declare the Bandai-1 evaluators (:data:`BANDAI1_CROSS`, kind ``corpus``): scored once at the end
    as ``evals.final`` scores the run's own splits; skipped with a line where Bandai-1 is not there."""
    for name, sources in BANDAI1_CROSS.items():
        c.evals[name] = dict(kind="corpus", sources=sources, name=name)
    return c


def use_bandai2(c: ml_collections.ConfigDict, window: int | None = None, unseen: bool = True
                ) -> ml_collections.ConfigDict:
    """Point ``c.data`` at Bandai-2 with the protocol of docs/protocol.md: ``validation`` and ``test``
    hold ~10% of the takes of each (content, style) pair each (whole clips), ``train`` the rest.

    ``unseen``: also hold out whole pairs (:data:`BANDAI2_UNSEEN`) as ``unseen_validation`` and
    ``unseen_test``; the held-out evaluators score both validation splits and the best checkpoint is
    chosen by their mean MPJPE. The final evaluation scores every held-out split once (not the
    training split: at ~2,000 clips its windows would cost more than the rest together; its loss is in
    the learning curves). The prepared directory is named by the window and the protocol."""
    if window is not None:
        c.data.window = window
    c.data.source = BANDAI2_SOURCE
    # Copies: only exact (re-encoded) ones. Repeated takes of one pair's slow gestures lie 0.61-1.17 cm
    # apart (RMS over >= 80% of their moving windows): at Bandai-1's 1.2 cm (dedup.COPY_M) 202 takes were
    # dropped as copies and 95 groups of up to 37 takes (a whole pair) had to share one split, so the
    # pairs could not be split by take. The only copies found are 2 takes at 0.00 cm (docs/data.md).
    c.data.copy_threshold = 0.004
    c.data.dir = (f"data_cache/bandai2_w{c.data.window}" + ("_unseen" if unseen else "")
                  + ("_clean" if c.data.clean == "repair" else ""))
    held_out = BANDAI2_UNSEEN if unseen else {}
    c.data.splits = ml_collections.ConfigDict({"train": "rest", **held_out,
                                               "validation": BANDAI2_SPLITS["validation"],
                                               "test": BANDAI2_SPLITS["test"]})
    seen = ("validation", "test")
    cross_corpus(c)
    if unseen:
        c.evals.heldout.splits = ("validation", "unseen_validation")
        c.evals.final.splits = ("validation", "unseen_validation", "test", "unseen_test")
        c.train.best_metric = "validation+unseen_validation/mpjpe"
    else:
        c.evals.heldout.splits = ("validation",)
        c.evals.final.splits = seen
    return c
