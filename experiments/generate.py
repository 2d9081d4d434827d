"""Motion generation: 4.3 s of motion given (content, style), sampled in the headline autoencoder's latent.

Three stages, one command (``make train CONFIG=experiments/generate.py``; ``motionjax.generation.run``):

1. **The autoencoder** (``experiments/autoencoder.py``'s model: a two-stage temporal conv net, 16 latent
   numbers per frame, the IK position head), frozen. ``generation.autoencoder`` names a run directory to
   take it from; empty (the default) trains it first in ``WORKDIR/autoencoder`` with this config's data
   and a shorter schedule than the headline's 9,000 steps (``train.steps`` below: the whole command must
   fit 30 minutes of 2 cores from a fresh clone). It is trained on 128-frame windows: it is
   convolutional in time, but its root-position features are standardized per window length.
2. **The evaluator** (``motionjax.evaluation.generative``): a content + style classifier over windows,
   trained once on the training split; its penultimate features give FID, diversity and multimodality.
3. **The generator** (``motionjax.generation``): rectified flow (flow matching) over the latent
   sequence of a window (``[32, 64]``: 32 latent frames of 64 numbers), a transformer conditioned on
   (content, style) embeddings with each label dropped 10% of the time for classifier-free guidance on
   both; samples decode through the frozen decoder to a motion on the dataset skeleton's bones.

The data: Bandai-1 (the headline autoencoder's corpus) in windows of 128 frames (4.3 s at 30 fps), clips
split into ``train`` (the rest), ``validation`` and ``test`` (about 10% of each content's clips), and
``unseen_pairs``: every clip of :data:`UNSEEN_PAIRS`, (content, style) combinations no stage ever trains
on, whose contents and styles all appear in training with other partners.

Variants (``--config experiments/generate.py:VARIANT``), comma-separated:
  ``deepmimic``: the 15 DeepMimic clips that ship with pybullet, labelled by :data:`DEEPMIMIC_LABELS`
  (``generation.clip_labels``; they have no label files), in 32-frame windows, its autoencoder without
  the IK position head (as experiments/autoencoder.py on DeepMimic): a toy corpus with no download, for
  the tests and ``notebooks/05_generate.ipynb``;
  ``dynamics``: the dynamics loss on decoded samples during training (``generation.dynamics_weight = 5``,
  the sweep's; ``benchmarks/generation_sweep.py``), with the same generator without it beside it
  (``WORKDIR/no_dynamics.npz``, its rows in the table);
  ``--config.generation.autoencoder=runs/generate/autoencoder`` reuses the default run's autoencoder;
  ``runlocal``: tiny models and a few steps of each stage (seconds; the tests).
"""

import ml_collections

from motionjax import configs
from motionjax.configs import base

autoencoder = configs.experiment("autoencoder")  # loaded by path: works from a wheel too

# (content, style) combinations held out of every stage: one per content family (locomotion at three
# speeds, two gestures, a bow), each style used once; the 10 x 15 grid of Bandai-1 has exactly one clip
# per combination (two for walk), so each pair is one take, and its content and style keep 14 (or 9)
# training partners each.
UNSEEN_PAIRS = (
    ("walk", "old"),
    ("run", "happy"),
    ("dash", "proud"),
    ("bow", "angry"),
    ("bye", "tired"),
    ("guide", "childish"),
)
_UNSEEN_CLIPS = (
    "dataset-1_walk_old_001",
    "dataset-1_walk_old_002",
    "dataset-1_run_happy_001",
    "dataset-1_dash_proud_001",
    "dataset-1_bow_angry_001",
    "dataset-1_bye_tired_001",
    "dataset-1_guide_childish_001",
)


# The DeepMimic clips as a labelled toy corpus: content by kind of motion, style by take (a or b). The pair
# dance/a is held out: dance and a both appear in training with other partners.
DEEPMIMIC_LABELS = {
    "walk": "loco/a",
    "crawl": "loco/a",
    "jump": "loco/a",
    "run": "loco/b",
    "backflip": "flip/a",
    "cartwheel": "flip/b",
    "roll": "flip/b",
    "spin": "flip/a",
    "kick": "fight/a",
    "punch": "fight/b",
    "spinkick": "fight/a",
    "dance_a": "dance/a",
    "dance_b": "dance/b",
    "getup_facedown": "getup/a",
    "getup_faceup": "getup/b",
}


def get_config(arg: str | None = None):
    parts = [p for p in (arg or "").split(",") if p]
    flags = ("bandai1", "deepmimic", "dynamics", "runlocal")
    unknown = [p for p in parts if p not in flags]
    if unknown:
        raise ValueError(f"unknown config variant {unknown}; expected some of {flags}")
    bandai1 = "bandai1" in parts or "deepmimic" in parts  # DeepMimic below starts from Bandai-1's settings
    c = autoencoder.get_config(
        ("bandai" if bandai1 else "bandai2") + (",runlocal" if "runlocal" in parts else "")
    )
    # The autoencoder stage when the run trains its own. The headline schedule is 9,000 steps (~24 min alone
    # on 2 cores); here 2,500 (Muon reaches 1.0 cm validation at 1,750 steps of the headline task) leave
    # the evaluator, the generator and the evaluation room; generation.autoencoder takes a headline run.
    c.train.update(steps=2500, eval_every=500, checkpoint_every=500, keep_checkpoints=1)
    if bandai1:
        base.use_bandai(c, window=128)
        c.data.dir = "data_cache/bandai1_w128_pairs" + ("_clean" if c.data.clean == "repair" else "")
        # Held-out pairs first (whole clips), then ~10% of each content's remaining clips each for
        # validation and test; the rest trains every stage.
        c.data.splits = ml_collections.ConfigDict(
            {
                "train": "rest",
                "unseen_pairs": "clips:" + ",".join(_UNSEEN_CLIPS),
                "validation": "stratified:content:0.1",
                "test": "stratified:content:0.1",
            }
        )
        c.data.update(chunk=16, batch_size=16)  # 16 windows x 128 frames: the headline's frames per step
        c.data.eval_stride = 8
        c.train.best_metric = "validation/mpjpe"
        c.evals = ml_collections.ConfigDict()
        c.evals.heldout = dict(kind="metrics", splits=("validation",), inputs=("clean",), during=True)
        c.evals.final = dict(kind="metrics", splits=("validation", "test", "unseen_pairs"), inputs=("clean",))
    else:
        # Bandai-2 under docs/protocol.md (experiments/autoencoder.py's default corpus and window): 64-frame
        # windows (2.1 s; half the clips are shorter than 117 frames, so 128-frame windows would be mostly
        # padding); every 16 frames in the held-out splits: 1,134 test windows (one sample each: >= 1,000
        # per row; FID's halves ~570 a side), 1,306 unseen-test ones (every 8: 2,128 / 2,525, twice the
        # cost of guided sampling, which the 2-core budget did not allow).
        c.data.eval_stride = 16
        for name in [k for k, v in c.evals.items() if v.get("kind") == "corpus"]:
            del c.evals[name]  # the autoencoder stage skips the Bandai-1 evaluators (time for sampling)

    g = c.generation = ml_collections.ConfigDict()
    g.autoencoder = ""  # a run directory of experiments/autoencoder.py; "" = train it first
    g.autoencoder_step = "best"  # its checkpoint: "best", "latest" or a step
    g.labels = ("content", "style")  # the conditioning labels (DatasetInfo.labels keys)
    # Labels of clips without label files, "CLIP_NAME": "VALUE/VALUE" (one value per key of g.labels).
    g.clip_labels = ml_collections.ConfigDict()
    # The pairs no stage trains on, checked against the splits named unseen* (a mirrored training window
    # whose mirrored labels are one of them is left out too).
    g.unseen_pairs = tuple(
        f"{a}/{b}" for a, b in (UNSEEN_PAIRS if bandai1 else (
            tuple(p.split("+"))
            for rule in base.BANDAI2_UNSEEN.values()
            for p in rule.split("=")[1].split(",")
        ))
    )
    # The latent dataset: sliding windows over every training clip, encoded once by the frozen encoder.
    g.window_stride = 4 if bandai1 else 8  # frames between training windows (Bandai-2: ~33,000 with mirrors)
    g.mirror = True  # also each window mirrored (the rig's mirror frames), labels swapped:
    g.mirror_labels = (  # a mirrored walk-left walks right
        {"walk-left": "walk-right", "walk-right": "walk-left"} if bandai1 else {
            f"{a}-{x}{b}": f"{a}-{y}{b}"
            for a, b in (("walk-turn", ""), ("wave", "-hand"), ("raise-up", "-hand"))
            for x, y in (("left", "right"), ("right", "left"))})
    # The generator: a transformer over the latent frames (rectified flow).
    g.dim = 128
    g.depth = 3
    g.heads = 4
    g.mlp_ratio = 4
    g.label_dropout = 0.1  # each label replaced by its "none" token (classifier-free guidance)
    # Bandai-2's ~34,000 training windows: at 2,000 steps (2 epochs) the flow loss was still falling and
    # test content accuracy was 0.73 (runs of 2026-12-06, docs/generation.md); Bandai-1's 2,000 kept.
    g.steps = 2000 if bandai1 else 8000
    g.batch_size = 32
    g.learning_rate = 4e-4
    g.warmup_steps = 100
    g.weight_decay = 1e-2
    g.ema_decay = 0.999
    g.log_every = 100
    # Sampling: Euler steps of the flow from noise (t = 0) to data (t = 1); guidance on each label:
    # v = v(-, -) + content_scale (v(c, -) - v(-, -)) + style_scale (v(c, s) - v(c, -)).
    g.sample_steps = 32
    g.sampler = "euler"  # or "heun" / "midpoint" (second order, 2 network evaluations a step)
    g.content_scale = 1.5
    g.style_scale = 1.5
    # Scales tried on validation after training (FID of samples against the validation windows, lowest
    # wins; 0 = off); the chosen pair samples the test and unseen-pairs evaluations. (1.5, 1.5) replaced
    # (3, 3) (the worst on Bandai-1 and Bandai-2 validation): on Bandai-2 validation it gave FID 31.1
    # against (2, 2)'s 33.3, paired difference -2.2 [-5.0, -0.4] over clips, the lowest of the sampling
    # levers tried (benchmarks/generation_sweep.py --sampling, docs/generation.md).
    g.guidance_grid = ((1.0, 1.0), (1.5, 1.5), (2.0, 2.0))
    # The dynamics loss on decoded samples (motionjax.core.dynamics.dynamics_loss: velocity, force and
    # jerk terms with config.loss.dynamics's weights) between the decoded one-step estimate of the clean
    # latent and the decoded training latent, weighted by t (an estimate from near noise says little),
    # on the first dynamics_batch windows of every batch. 0 = off.
    # Off: on validation (benchmarks/generation_sweep.py, docs/generation.md) weight 5 cut skating and the
    # root residual force ~46% but cost +12% FID and -27% content accuracy at this size (target: <= +5% FID).
    g.dynamics_weight = 0.0
    g.dynamics_batch = 8
    g.foot_weight = 0.0  # the foot-skating term of motionjax.losses on the same pair
    # Physics guidance at sampling time (motionjax.generation.flow.physics_cost of the decoded one-step
    # estimate), from t = physics_guidance_from on; the scale is in the velocity's units. 0 = off. Terms:
    # "force" (root residual force beyond standing), "contact" (ours: Foot/Toes speed on a soft contact
    # near each one's planted height), "band" (the papers' skating ratio smoothed: the skating joints'
    # step speed in the band in both frames). Bandai-2: "band" at 0.25, chosen on validation by the rule
    # "skating ratio <= -35%, contact frames >= -8%, FID interval overlapping, lowest FID" (benchmarks/
    # generation_sweep.py --physics-guidance 0,0.25 --physics-terms band --then test,unseen_test
    # --then-if-met; docs/generation.md): test -36% skating ratio, contact -8%, FID unchanged. Bandai-1
    # and DeepMimic keep "force" + "contact" at 0.5, chosen on Bandai-1 validation. The table also
    # samples the same generator without it (the no_physics rows).
    g.physics_guidance = 0.5 if bandai1 else 0.25
    g.physics_guidance_from = 0.5
    g.physics_terms = ("force", "contact") if bandai1 else ("band",)
    # The evaluator (motionjax.evaluation.generative): a temporal conv classifier of both labels.
    g.evaluator = ml_collections.ConfigDict(
        dict(dim=128, features=32, steps=2000, batch_size=64, learning_rate=1e-3, stride=4)
    )
    # Evaluation: a sample per real window of the split, with its labels (intervals over clips replace
    # repeated samplings); diversity over `diversity_size` random pairs, multimodality over
    # `multimodality_size` pairs of samples of one condition (Guo et al. 2020, 2022),
    # `multimodality_samples` samples per condition.
    g.diversity_size = 200
    g.multimodality_samples = 10
    g.multimodality_size = 5
    # The papers' skating ratio (GMD, OmniControl; motionjax.evaluation.plausibility): the ball of each foot
    # within 2 cm of the floor. Calibrated on real Bandai clips (benchmarks/skating_band.py,
    # docs/generation.md): at their 5 cm the band catches the swing foot (real Bandai-2 training windows
    # 0.12, Bandai-1 0.25), at 2 cm real motion scores 0.017 / 0.058 with 81% / 67% of foot-frames in it.
    g.skating_joints = ("Toes_L", "Toes_R")
    g.skating_band_m = 0.02
    g.export_samples = 4  # samples written as BVH (and one video of them side by side)
    g.video_s = 4.0  # 0 = no video
    if "dynamics" in parts:
        g.dynamics_weight = 5.0
    if "deepmimic" in parts:
        c.data.update(
            source="deepmimic",
            dir="data_cache/deepmimic_w32_generate_clean",
            window=32,
            chunk=8,
            batch_size=8,
            eval_stride=8,
            mirror_prob=0.0,
            speed_range=1.0,
        )
        # No IK position head, as experiments/autoencoder.py trains DeepMimic (its knees and elbows are
        # hinges, which the IK reaches only when the rotation head's twists are right).
        c.model.position_head = False
        c.data.splits = ml_collections.ConfigDict(
            {
                "train": "rest",
                "unseen_pairs": "clips:humanoid3d_dance_a",
                "test": "clips:humanoid3d_backflip,humanoid3d_getup_faceup,humanoid3d_spinkick",
                "validation": "tail:0.3",
            }
        )
        g.clip_labels = {f"humanoid3d_{k}": v for k, v in DEEPMIMIC_LABELS.items()}
        g.update(unseen_pairs=("dance/a",), window_stride=4, mirror=False)
        g.update(skating_joints=(), skating_band_m=0.05)  # no toes: the lowest pair, the papers' band
        g.evaluator.update(stride=4)
    if "runlocal" in parts:
        c.data.update(batch_size=8)
        # AdamW: over six steps Muon's orthogonalization only lengthens the step's compile.
        c.train.update(steps=6, warmup_steps=2, log_every=1, eval_every=3, checkpoint_every=2,
                       optimizer="adamw")
        g.update(
            dim=32,
            depth=1,
            heads=2,
            mlp_ratio=2,
            steps=20,
            batch_size=16,
            warmup_steps=2,
            log_every=5,
            sample_steps=4,
            guidance_grid=((1.0, 1.0), (2.0, 2.0)),
            diversity_size=8,
            multimodality_samples=4,
            multimodality_size=2,
            export_samples=2,
            video_s=0.0,
            window_stride=16,
            dynamics_batch=4,
        )
        g.evaluator.update(
            dim=16, features=8, steps=60, batch_size=16, stride=4 if "deepmimic" in parts else 16
        )
        if "deepmimic" in parts:
            g.window_stride = 4
    return c
