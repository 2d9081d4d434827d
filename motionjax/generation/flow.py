"""Rectified flow (flow matching) over latent sequences: the training objective, the train loop, sampling
with classifier-free guidance on every label, and the dynamics loss on decoded samples.

Flow (Liu et al. 2023, "Flow Straight and Fast"; Lipman et al. 2023): noise ``x₀ ~ N(0, I)``, data ``x₁``
(standardized latents ``[B, L, D]``), ``x_t = (1 − t) x₀ + t x₁``; the network learns the velocity ``x₁ −
x₀`` (mean squared error), and sampling integrates ``dx/dt = v(x, t)`` from ``t = 0`` to 1 (Euler steps, or
Heun's or the midpoint's second-order ones: ``generation.sampler``).

Guidance (Ho & Salimans 2022, composed over the label keys in order, as in InstructPix2Pix's two-scale
form): ``v = v(∅, ∅) + s_content (v(c, ∅) − v(∅, ∅)) + s_style (v(c, s) − v(c, ∅))``; scales 0 sample the
unconditional flow (the labels are ignored), 1 each the conditional one. Training drops each label to its
"none" token with probability ``label_dropout``.

The dynamics loss on invented motion (``dynamics_weight > 0``): the one-step estimate of the clean latent,
``x̂₁ = x_t + (1 − t) v̂``, and the training latent ``x₁`` are decoded by the frozen decoder into motions, and
:func:`motionjax.core.dynamics.dynamics_loss` (velocity consistency, generalized forces ``Jᵀ m (a − g)``
matched to the real motion's, jerk; ``config.loss.dynamics``'s term weights) is added per window, weighted
by ``t`` (an estimate made from near noise is a blur of many motions).

Physics guidance at sampling time (``physics_guidance > 0``; after Chung et al. 2023's guidance through
the one-step estimate, as motion generators use it for foot contact, e.g. GMD, Karunratanakul et al.
2023): in the last ``1 − guide_from`` of the Euler steps the velocity is pushed down the gradient of
:func:`physics_cost` of the decoded estimate ``x̂₁`` (the gradient taken at ``x̂₁``, not through the
network), normalized per window to unit RMS so the scale is in the velocity's own units. Unlike the
loss, it needs no real motion to compare with.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from motionjax.core import dynamics
from motionjax.core.features import destandardize, unpack
from motionjax.core.kinematics import forward_kinematics
from motionjax.evaluation import generative
from motionjax.generation.model import FlowTransformer


class LatentStats:
    """Per-dimension mean and std ``[D]`` of the training latents: the flow runs on standardized ones."""

    def __init__(self, mean, std):
        self.mean, self.std = np.asarray(mean, np.float32), np.asarray(std, np.float32)

    @classmethod
    def fit(cls, z) -> LatentStats:
        z = np.asarray(z, np.float64).reshape(-1, np.shape(z)[-1])
        return cls(z.mean(0), z.std(0) + 1e-6)

    def standardize(self, z):
        return (z - self.mean) / self.std

    def raw(self, z):
        return z * self.std + self.mean


def make_generator(g, length: int, latent_dim: int, classes, seed: int) -> FlowTransformer:
    """A fresh :class:`FlowTransformer` of ``config.generation`` (``g``)."""
    return FlowTransformer(
        length,
        latent_dim,
        tuple(classes),
        dim=g.dim,
        depth=g.depth,
        heads=g.heads,
        mlp_ratio=g.mlp_ratio,
        rngs=nnx.Rngs(seed),
    )


def physics_term(codec, codec_state, stats: LatentStats, info, fps: float, term_weights: dict):
    """``(x̂₁ [B, L, D], x₁ [B, L, D], t [B]) -> scalar``: the t-weighted mean over windows of the dynamics
    loss between the decoded estimate and the decoded training latent (standardized latents in)."""
    sk, mean, std = info.skeleton, np.asarray(info.mean, np.float32), np.asarray(info.std, np.float32)

    def motion(z):
        x = codec.decode_fn(codec_state, z * stats.std + stats.mean)  # [B, N, C, F]
        x = destandardize(x.reshape(x.shape[0], -1, x.shape[-1]), mean, std)
        return unpack(sk, x)

    def per_window(pr, pq, tr, tq):
        return dynamics.dynamics_loss(sk, pr[None], pq[None], tr[None], tq[None], fps, term_weights)[0]

    def term(x1_hat, x1, t):
        p_root, p_rot = motion(x1_hat)
        t_root, t_rot = jax.lax.stop_gradient(motion(x1))
        losses = jax.vmap(per_window)(p_root, p_rot, t_root, t_rot)
        return jnp.mean(t * losses)

    return term


@dataclasses.dataclass(frozen=True, eq=False)  # hashed by identity: a static argument of the sampler
class PhysicsCost:
    """``cost(z [B, L, D]) -> [B]`` as ``fn(params, z)``: the frozen decoder's weights and the statistics
    travel as ``params`` (arguments of the compiled sampler, not constants XLA would fold)."""

    fn: Callable
    params: dict

    def __call__(self, z):
        return self.fn(self.params, z)


def band_skating(foot, up: int, fps: float, band_m: float):
    """``foot [B, T, K, 3]`` (m, the floor at height 0) -> ``[B]``: a smooth version of the papers' skating
    ratio (:func:`motionjax.evaluation.plausibility.skating_pairs`), the mean over frame pairs ``(t, t+1)``
    and joints of ``w · |Δx_h · fps|² / (1 m/s)²``: the squared horizontal speed of the step, weighted by
    ``w = σ((band_m − h_t) / s) · σ((band_m − h_{t+1}) / s)``, ``s = band_m / 4``, a soft "in the band in both
    frames", the pairs the ratio counts when they are faster than 0.5 m/s.

    Its gradient both slows a foot in the band and lifts a fast one out of it (through ``w``, in proportion
    to its speed: a planted, still foot is not lifted). Both are needed: on Bandai-2 validation the
    generated pairs the ratio counts are mostly low swings, not slides (with the heights held, guidance
    cut the cm/s skating 27% and left the ratio where it was, docs/generation.md)."""
    h = foot[..., up]  # [B, T, K]
    inside = jax.nn.sigmoid((band_m - h) / (band_m / 4))
    w = inside[:, 1:] * inside[:, :-1]  # [B, T-1, K]
    speed = jnp.delete(foot[:, 1:] - foot[:, :-1], up, axis=-1) * fps  # [B, T-1, K, 2]
    return jnp.mean(w * jnp.sum(speed**2, -1), (1, 2))


TERMS = ("force", "contact", "band")
UNNAMED_TERMS = ("force", "contact")  # the terms of a config without generation.physics_terms (older runs)


def physics_cost(codec, codec_state, stats: LatentStats, info, fps: float, feet,
                 terms=UNNAMED_TERMS) -> PhysicsCost:
    """``z [B, L, D]`` (standardized latents) -> ``[B]``: what a decoded sample must answer for physically,
    with no real motion to compare with. Per window, the sum of the ``terms`` (any of :data:`TERMS`):

    * ``"force"``, ``‖τ_root − g·up‖² / g²`` (mean over inner frames): the root residual force (the root's
      part of ``τ = Jᵀ m (a − g)``, :func:`motionjax.core.dynamics.generalized_forces`, blocked) beyond the
      9.81 N/kg that standing needs, i.e. the body's centre-of-mass acceleration, which only contact can
      supply;
    * ``"contact"`` (ours): ``c · |v_h|² / (1 m/s)²`` over ``feet.joints`` (mean over inner frames): the
      horizontal speed of each foot joint weighted by a soft contact ``c = σ((contact_m − lift) /
      (contact_m / 4))`` (``lift``: height above its planted height,
      :class:`motionjax.evaluation.plausibility.Feet`): sliding while planted, a smooth ``foot_skate``;
    * ``"band"`` (the papers'): :func:`band_skating` of ``feet.standard`` within ``feet.band_m`` of the
      floor, a smooth ``skate_ratio``.
    """
    terms = tuple(terms)
    unknown = [x for x in terms if x not in TERMS]
    if unknown or not terms:
        raise ValueError(f"physics cost terms {terms}: one or more of {TERMS}")
    sk, up, joints = info.skeleton, info.skeleton.up_axis, np.asarray(feet.joints)
    params = {"codec": codec_state, "z_mean": jnp.asarray(stats.mean), "z_std": jnp.asarray(stats.std),
              "mean": jnp.asarray(info.mean, jnp.float32), "std": jnp.asarray(info.std, jnp.float32),
              "floor": jnp.asarray(feet.floor, jnp.float32)}

    def cost(p, z):
        x = codec.decode_fn(p["codec"], z * p["z_std"] + p["z_mean"])  # [B, N, C, F]
        x = destandardize(x.reshape(x.shape[0], -1, x.shape[-1]), p["mean"], p["std"])
        root, rotations = unpack(sk, x)
        fk = forward_kinematics(sk, rotations, root)  # once, for the forces and the feet
        total = jnp.zeros(x.shape[0], x.dtype)
        if "force" in terms:
            standing = jnp.zeros(3, x.dtype).at[up].set(dynamics.GRAVITY)
            tau = dynamics.generalized_forces(sk, root, rotations, fps, fk=fk)[:, 1:-1, 0]  # [B, T-2, 3]
            total += jnp.mean(jnp.sum((tau - standing) ** 2, -1), -1) / dynamics.GRAVITY**2
        if "contact" in terms:
            foot = fk[0][:, :, joints]  # [B, T, K, 3]
            speed = jnp.delete((foot[:, 2:] - foot[:, :-2]) * (fps / 2), up, axis=-1)  # [B, T-2, K, 2]
            lift = foot[:, 1:-1, :, up] - p["floor"]
            contact = jax.nn.sigmoid((feet.contact_m - lift) / (feet.contact_m / 4))
            total += jnp.mean(contact * jnp.sum(speed**2, -1), (1, 2))
        if "band" in terms:
            total += band_skating(fk[0][:, :, np.asarray(feet.standard)], up, fps, feet.band_m)
        return total

    return PhysicsCost(cost, params)


def train_generator(g, latents, labels, classes, *, seed: int, physics=None, log=None):
    """Train a generator of ``config.generation`` (``g``) on standardized ``latents [K, L, D]`` with integer
    ``labels [K, n_keys]``; ``physics``: :func:`physics_term` (used when ``g.dynamics_weight > 0``).
    Returns ``(model with the EMA weights, {"steps_per_s", "loss", "dynamics"})``; ``log(step, metrics)``."""
    latents, labels = np.asarray(latents, np.float32), np.asarray(labels, np.int32)
    k, length, d = latents.shape
    model = make_generator(g, length, d, classes, seed)
    graphdef, params = nnx.split(model, nnx.Param)
    schedule = optax.warmup_cosine_decay_schedule(
        0.0, g.learning_rate, min(g.warmup_steps, g.steps - 1), g.steps, end_value=0.1 * g.learning_rate
    )
    tx = optax.chain(
        optax.clip_by_global_norm(1.0), optax.adamw(schedule, b2=0.99, weight_decay=g.weight_decay)
    )
    opt_state = tx.init(params)
    ema = jax.tree.map(jnp.copy, params)
    none = jnp.asarray(classes, jnp.int32)
    use_physics = physics is not None and g.dynamics_weight > 0
    n_phys = min(int(g.dynamics_batch), int(g.batch_size))

    def loss_fn(params, x1, y, key):
        kx, kt, kd = jax.random.split(key, 3)
        x0 = jax.random.normal(kx, x1.shape)
        t = jax.random.uniform(kt, (x1.shape[0],))
        xt = (1 - t[:, None, None]) * x0 + t[:, None, None] * x1
        y = jnp.where(jax.random.uniform(kd, y.shape) < g.label_dropout, none, y)
        v = nnx.merge(graphdef, params)(xt, t, y)
        flow = jnp.mean((v - (x1 - x0)) ** 2)
        dyn = jnp.float32(0.0)
        if use_physics:
            x1_hat = xt[:n_phys] + (1 - t[:n_phys, None, None]) * v[:n_phys]
            dyn = physics(x1_hat, x1[:n_phys], t[:n_phys])
        return flow + g.dynamics_weight * dyn, (flow, dyn)

    @jax.jit
    def step(params, opt_state, ema, x1, y, key, n):
        (loss, (flow, dyn)), grads = jax.value_and_grad(loss_fn, has_aux=True)(params, x1, y, key)
        updates, opt_state = tx.update(grads, opt_state, params)
        params = optax.apply_updates(params, updates)
        # The average warms up (decay (1 + n) / (10 + n) until ema_decay): a short run's average is not
        # held back by its initial weights.
        decay = jnp.minimum(g.ema_decay, (1.0 + n) / (10.0 + n))
        ema = optax.incremental_update(params, ema, 1.0 - decay)
        return params, opt_state, ema, {"loss": loss, "flow": flow, "dynamics": dyn}

    rng, key = np.random.default_rng(seed), jax.random.key(seed)
    start, metrics, history = None, None, []
    for i in range(g.steps):
        pick = rng.integers(0, k, g.batch_size)
        params, opt_state, ema, metrics = step(
            params, opt_state, ema, latents[pick], labels[pick], jax.random.fold_in(key, i), jnp.float32(i)
        )
        if i == 0:
            jax.block_until_ready(metrics)
            start = time.perf_counter()  # after the compile
        if (i + 1) % g.log_every == 0 or i + 1 == g.steps:
            m = {name: float(v) for name, v in jax.device_get(metrics).items()}
            history.append((i + 1, m))
            if log is not None:
                log(i + 1, m)
    jax.block_until_ready(ema)
    rate = (g.steps - 1) / max(time.perf_counter() - start, 1e-9) if g.steps > 1 else float("nan")
    model = nnx.merge(graphdef, ema)
    return model, {"steps_per_s": rate, "history": history}


def reconstruction_cost(codec, codec_state, stats: LatentStats, info) -> PhysicsCost:
    """``cost(params, z [B, L, D], target [B, T, J, 3], weight [B, T, J, 3]) -> [B]``: per window, the
    weighted mean squared distance (cm²) between the joint positions that ``z`` (standardized latents)
    decodes to, on the skeleton's bones, and ``target`` (m), ``weight`` 0 where nothing is given:
    in-betweening weighs every joint of the given frames, trajectory control the root's horizontal path.
    Positions, not standardized features: a few near-constant features have a std of ~0.003 and would
    outweigh the rest."""
    sk = info.skeleton
    params = {"codec": codec_state, "z_mean": np.asarray(stats.mean), "z_std": np.asarray(stats.std),
              "mean": np.asarray(info.mean, np.float32), "std": np.asarray(info.std, np.float32)}

    def cost(p, z, target, weight):
        x = codec.decode_fn(p["codec"], z * p["z_std"] + p["z_mean"])  # [B, N, C, F]
        x = destandardize(x.reshape(x.shape[0], -1, x.shape[-1]), p["mean"], p["std"])
        root, rotations = unpack(sk, x)
        pos = forward_kinematics(sk, rotations, root)[0]  # [B, T, J, 3]
        axes = tuple(range(1, pos.ndim))
        return jnp.sum(weight * (100 * (pos - target)) ** 2, axes) / jnp.maximum(jnp.sum(weight, axes), 1e-9)

    return PhysicsCost(cost, params)


def fit_step(fit, params, z, target, weight, rate, max_step: float = 0.02):
    """One Polyak step per window on ``cost = fit(params, z, target, weight) [B]``: ``z − rate · cost /
    ‖∇cost‖² · ∇cost``, the step that removes ``rate`` of each window's cost where the cost is linear (its
    least value 0: the given frames met). Scale-free: the same rate for any decoder and any units. Its
    RMS is capped at ``max_step`` (standardized latent units): where the decoder cannot meet the target,
    the gradient vanishes at a nonzero cost and the uncapped step would grow without bound."""
    cost, vjp = jax.vjp(lambda z: fit(params, z, target, weight), z)
    grad = vjp(jnp.ones_like(cost))[0]  # [B, L, D]: each window's cost depends on its own latent only
    norm = jnp.sum(grad**2, axis=(1, 2), keepdims=True)
    step = rate * cost[:, None, None] / (norm + 1e-12) * grad
    rms = jnp.sqrt(jnp.mean(step**2, axis=(1, 2), keepdims=True))
    return z - step * jnp.minimum(1.0, max_step / (rms + 1e-12))


SAMPLERS = ("euler", "heun", "midpoint")  # generation.sampler: how :func:`sample` steps the flow's ODE


def sampler_of(g) -> str:
    """The ``generation`` config's :data:`SAMPLERS` entry; ``"euler"`` for a run's config from before
    ``generation.sampler`` existed (its samples were Euler's)."""
    return g.get("sampler", SAMPLERS[0])


@functools.partial(jax.jit, static_argnames=("graphdef", "steps", "guide", "guide_from", "start", "fit",
                                             "fit_steps", "sampler"))
def _sample(graphdef, params, noise, labels, scales, steps: int, guide=None, guide_params=None,
            guide_scale=0.0, guide_from=0.5, start: int = 0, source=None, known=None, fit=None,
            fit_params=None, target=None, weight=None, fit_steps: int = 0, fit_rate=0.0,
            sampler: str = "euler"):
    model = nnx.merge(graphdef, params)
    # Editing (:func:`sample`'s ``source``): the flow's state at t = start / steps on the straight path
    # from this noise to the source, and the ``known`` latent frames [B, L] held on that path every step.
    on_path = lambda x, t: x if source is None or known is None else jnp.where(  # noqa: E731
        known[..., None], (1 - t) * noise + t * source, x)
    b, n_keys = labels.shape
    none = jnp.asarray(model.classes, labels.dtype)
    # Row k of the guidance chain has the first k label keys set, the others "none".
    chain = jnp.stack(
        [jnp.where(jnp.arange(n_keys) < k, labels, none) for k in range(n_keys + 1)]
    )  # [K+1, B, n]
    chain = chain.reshape(-1, n_keys)

    def velocity(x, at):
        """The guided velocity at ``x``, flow time ``at / steps`` (``at``: steps done, maybe a fraction)."""
        t = at / steps
        v = model(jnp.tile(x, (n_keys + 1, 1, 1)), jnp.full(((n_keys + 1) * b,), t, jnp.float32), chain)
        v = v.reshape(n_keys + 1, b, *x.shape[1:])
        guided = v[0] + sum(scales[k] * (v[k + 1] - v[k]) for k in range(n_keys))
        if guide is not None:  # physics guidance at the one-step estimate of the clean latent
            x1_hat = x + (1 - t) * guided

            def push(z):
                grad = jax.grad(lambda z: jnp.sum(guide(guide_params, z)))(z)
                return grad / (jnp.sqrt(jnp.mean(grad**2, axis=(1, 2), keepdims=True)) + 1e-12)

            on = at >= guide_from * steps
            guided = guided - guide_scale * jax.lax.cond(on, push, jnp.zeros_like, x1_hat)
        return guided

    def body(i, x):
        x = on_path(x, i / steps)
        guided = velocity(x, i)
        # Second-order steps (the slope of the step from two evaluations, 2 per step): Heun's (the mean of
        # the slopes at both ends, the end's at the Euler step's point) and the midpoint's (the slope at
        # the half step's point).
        if sampler == "heun":
            guided = (guided + velocity(x + guided / steps, i + 1)) / 2
        elif sampler == "midpoint":
            guided = velocity(x + guided / (2 * steps), i + 0.5)
        if fit is None:
            return x + guided / steps
        # Reconstruction guidance (DiffPIR's step, Zhu et al. 2023, on the flow's straight paths): the
        # clean estimate x̂₁ is moved down the gradient of the given frames' decoding error (``fit_steps``
        # of :func:`fit_step`), the noise estimate x̂₀ = x − t·v kept, and the state put back on the
        # straight path between them at the next time.
        x0_hat, x1_hat = x - (i / steps) * guided, x + (1 - i / steps) * guided
        x1_fit = jax.lax.fori_loop(0, fit_steps, lambda _, z: fit_step(fit, fit_params, z, target, weight,
                                                                       fit_rate), x1_hat)
        return (1 - (i + 1) / steps) * x0_hat + (i + 1) / steps * x1_fit

    x = noise if source is None else (1 - start / steps) * noise + start / steps * source
    return on_path(jax.lax.fori_loop(start, steps, body, x), 1.0)


def sample(model: FlowTransformer, labels, scales, steps: int, key, batch: int = 128, guide=None,
           guide_scale: float = 0.0, guide_from: float = 0.5, source=None, strength: float = 1.0,
           known=None, fit=None, target=None, weight=None, fit_steps: int = 0,
           fit_rate: float = 0.0, sampler: str = "euler") -> np.ndarray:
    """Standardized latents ``[B, L, D]`` for integer ``labels [B, n_keys]``: ``steps`` steps of the guided
    flow from Gaussian noise (``key``), each of ``sampler`` (:data:`SAMPLERS`: ``"euler"``, one network
    evaluation a step; ``"heun"`` or ``"midpoint"``, second order, two); ``scales`` one guidance scale per
    label key; ``guide``
    (:func:`physics_cost`, the same object each call: it is part of the compiled program's key) with
    ``guide_scale > 0``: physics guidance from ``t = guide_from`` on.

    Editing a motion (SDEdit, Meng et al. 2022, on the flow's straight paths): ``source [B, L, D]``
    (standardized latents) is noised to flow time ``1 − strength`` (``x_t = (1 − t) ε + t·source``) and the
    flow integrated from there to 1 with the labels asked for (style transfer: the source's content, another
    style); ``known [B, L]`` (bool): latent frames held on the source's path at every step and equal to it at
    the end (inpainting, as RePaint's replacement, Lugmayr et al. 2022), the others generated to fit them.

    Reconstruction guidance (``fit``: :func:`reconstruction_cost`, the same object each call, with
    ``fit_steps > 0``: that many :func:`fit_step` of ``fit_rate``, 0 to 1) at every step the clean estimate is
    pulled toward decoding to ``target [B, T, J, 3]``
    (joint positions, m) where ``weight [B, T, J, 3]`` is nonzero, per window (in-betweening: the given
    frames; trajectory control: a root path; :func:`reconstruction_cost`)."""
    if sampler not in SAMPLERS:
        raise ValueError(f"sampler {sampler!r}: one of {', '.join(SAMPLERS)}")
    labels = np.asarray(labels, np.int32)
    graphdef, params = nnx.split(model)
    length, d = model.position.shape[0], model.head.out_features
    noise = np.asarray(jax.random.normal(key, (len(labels), length, d)))
    scales = jnp.asarray(scales, jnp.float32)
    fn, guide_params = (guide.fn, guide.params) if guide is not None and guide_scale > 0 else (None, None)
    start = int(round((1.0 - strength) * steps)) if source is not None else 0
    fitting = fit is not None and fit_steps > 0
    if fitting and (target is None or weight is None):
        raise ValueError("reconstruction guidance needs a target and its weight")
    arrays = {"x": noise, "y": labels, "src": source, "kn": known, "target": target if fitting else None,
              "weight": weight if fitting else None}
    names = [k for k, a in arrays.items() if a is not None]
    dtypes = {"y": np.int32, "kn": bool}

    def run(*parts):
        a = dict(zip(names, parts, strict=True))
        return _sample(graphdef, params, jnp.asarray(a["x"]), jnp.asarray(a["y"]), scales, steps, fn,
                       guide_params, jnp.float32(guide_scale), float(guide_from), start, a.get("src"),
                       a.get("kn"), fit.fn if fitting else None, fit.params if fitting else None,
                       a.get("target"), a.get("weight"), int(fit_steps) if fitting else 0,
                       jnp.float32(fit_rate), sampler)

    return generative.in_batches(run, batch, *(np.asarray(arrays[k], dtypes.get(k, np.float32))
                                               for k in names))
