"""Shared base config; experiments import ``get_config`` from here and override a few fields.

Every knob the code reads lives here (no hidden defaults in library code). Sections:
``data`` (motionjax.data), ``model`` (motionjax.models), ``loss`` (motionjax.losses and the
dynamics terms), ``mesh`` (motionjax.parallel), ``train`` (motionjax.train).
"""
import ml_collections


def get_config() -> ml_collections.ConfigDict:
    c = ml_collections.ConfigDict()
    c.seed = 0

    c.data = ml_collections.ConfigDict()
    c.data.source = "deepmimic"        # "deepmimic" (pybullet clips), "synthetic", or a directory of BVH/DeepMimic files
    c.data.dir = "data_cache/deepmimic"  # prepared ArrayRecord shards + index.json + stats
    c.data.fps = 30.0                  # every clip is resampled to this rate
    c.data.window = 64                 # frames per training window (T)
    c.data.chunk = 16                  # frames per time chunk (C); T = N * C
    c.data.batch_size = 32             # global batch (windows)
    c.data.worker_count = 0            # grain mp_prefetch workers; 0 is fastest on 2 cores
    c.data.prefetch = 2                # batches prefetched onto the devices
    c.data.dynamics_weight = 0.5       # window sampling: mix of dynamics-score weighting and uniform

    c.model = ml_collections.ConfigDict()
    c.model.name = "transformer"       # "transformer" | "tconv"
    c.model.dim = 128                  # per-frame embedding width
    c.model.depth = 1                  # blocks before and after the bottleneck (each)
    c.model.heads = 4                  # attention heads (transformer)
    c.model.mlp_ratio = 2              # MLP hidden width / dim (transformer)
    c.model.halo = 4                   # frames seen from each neighbouring chunk per block (transformer), <= chunk
    c.model.kernel = 9                 # temporal conv width (tconv); its halo is kernel // 2 frames
    c.model.stride = 2                 # frames pooled into one latent vector; divides data.chunk
    c.model.latent_dim = 32            # latent width per `stride` frames: latent_dim / stride numbers per frame
    c.model.residual = False           # True: predict a correction to the input (bypasses the bottleneck)
    c.model.dropout = 0.0
    c.model.dtype = "bfloat16"         # activation/compute dtype
    c.model.param_dtype = "float32"    # parameter (and optimizer state) dtype

    c.loss = ml_collections.ConfigDict()
    c.loss.jacobian = "blocked"        # "blocked" | "jvp" | "dense"

    c.mesh = ml_collections.ConfigDict()
    c.mesh.shape = (("data", -1), ("time", 1))  # -1 fills with the remaining devices
    c.mesh.across_hosts = "data"       # with several processes this axis spans them (hybrid mesh)
    c.mesh.fsdp = False                # split each parameter's largest dim over 'data' instead of replicating
    c.mesh.grad_reduce_dtype = "float32"  # dtype of the gradient all-reduce over 'data' ("bfloat16" halves bytes)

    c.train = ml_collections.ConfigDict()
    c.train.steps = 1000
    return c
    c.loss.rotation = 1.0              # weight of the rotation term, mean (1 - cos angle) per joint
    c.loss.position = 10.0             # weight of the FK position term, mean joint error (m)
    c.loss.foot = 0.1                  # weight of foot skating: foot speed^2 where the truth is planted
    c.loss.contact_speed = 0.3         # m/s: a slower true foot is planted (loss and foot-skate metric)
    c.loss.dynamics_weight = 1.0       # weight of motionjax.dynamics.dynamics_loss (0 disables it)
    c.train.learning_rate = 1e-3       # peak adamw learning rate
    c.train.warmup_steps = 50          # linear warmup (optimizer updates), then cosine decay
    c.train.final_lr_fraction = 0.05   # cosine ends at this fraction of the peak
    c.train.b1 = 0.9
    c.train.b2 = 0.99
    c.train.weight_decay = 1e-4
    c.train.grad_clip = 1.0            # global-norm clipping
    c.train.grad_accum_steps = 1       # >1: optax.MultiSteps averages this many micro-batches per update
    c.train.max_nonfinite_steps = 5    # this many non-finite steps in a row restore the last checkpoint
    c.train.log_every = 10             # steps between train-metric logs
    c.train.eval_every = 200           # steps between held-out evaluations (and best-checkpoint candidates)
    c.train.checkpoint_every = 100     # steps between checkpoints
    c.train.keep_checkpoints = 2       # last N checkpoints kept (plus the best by held-out MPJPE)
    c.train.eval_splits = ("heldout_clips", "heldout_tail")  # unseen clips; last 20% of training clips
    c.train.eval_noise_level = 1.0     # noise level of the denoising evaluation (data.make_eval_batches)
    c.train.pca_batches = 8            # training batches the per-frame PCA reference is fitted on
    c.train.references = ("no_dynamics",)  # also train the same model without the dynamics loss
