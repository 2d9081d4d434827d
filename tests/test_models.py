"""motionjax.models: shapes and dtypes, halo windows against numpy, chunk locality, sharded == unsharded."""
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from motionjax import models
from motionjax.configs.base import get_config
from motionjax.models import AttentionBlock, chunk_windows, make_model, rope

F, C = 15, 8  # 3 root + 2 rotating joints; chunk length


def small_config(name, **overrides):
    cfg = get_config().model
    cfg.update(name=name, dim=32, depth=1, heads=2, mlp_ratio=2, halo=2, kernel=5, stride=2, latent_dim=16,
               dtype="float32")
    cfg.update(**overrides)
    return cfg


def model(name, mesh=None, seed=0, **overrides):
    return make_model(small_config(name, **overrides), F, C, nnx.Rngs(seed), mesh=mesh)


def features(shape, seed=0):
    return jax.random.normal(jax.random.key(seed), shape, jnp.float32)


def perturb(m, scale=0.1, seed=7):
    """Random offsets on every parameter, so the zero-initialised heads pass signal through."""
    rng = np.random.default_rng(seed)  # numpy: nothing to compile per parameter shape
    noise = lambda p: jnp.asarray(p + scale * rng.standard_normal(p.shape, np.float32))
    nnx.update(m, jax.tree.map(noise, nnx.state(m, nnx.Param)))
    return m


apply = nnx.jit(lambda m, x: m(x))


def test_chunk_windows_match_numpy_slicing():
    b, n, c, h = 2, 3, 4, 2
    x = np.arange(b * n * c, dtype=np.float32).reshape(b, n, c, 1)
    windows, valid = chunk_windows(jnp.asarray(x), h)
    flat = np.pad(x.reshape(b, n * c, 1), ((0, 0), (h, h), (0, 0)), mode="edge")
    for i in range(n):
        np.testing.assert_array_equal(windows[:, i], flat[:, i * c : i * c + c + 2 * h])
    t = np.arange(n)[:, None] * c + np.arange(-h, c + h)
    np.testing.assert_array_equal(valid, (t >= 0) & (t < n * c))


@pytest.mark.parametrize("name", ["transformer", "tconv"])
def test_shapes_dtypes_and_latent(name):
    m = model(name, dtype="bfloat16")
    x = features((1, 7, C, F))  # test_models_are_local_in_time's shape: its program is m32's below
    y = apply(m, x)
    assert y.shape == x.shape and y.dtype == jnp.float32
    assert nnx.jit(lambda m, x: m.encode(x))(m, x).shape == (1, 7, C // 2, 16) and m.latent_per_frame == 8
    params = jax.tree.leaves(nnx.state(m, nnx.Param))
    assert params and all(p.dtype == jnp.float32 for p in params)
    # bf16 compute approximates the same function as fp32 compute with the same parameters.
    perturb(m)
    m32 = model(name)
    nnx.update(m32, nnx.state(m, nnx.Param))
    y16, y32 = apply(m, x), apply(m32, x)
    assert float(jnp.linalg.norm(y16 - y32) / jnp.linalg.norm(y32)) < 0.05


def frame_influence(f, x, chunk, frame):
    """``[N, C]`` max |change| of ``f(x)`` per output frame when input frame ``(chunk, frame)`` moves."""
    kick = features(x.shape[-1:], 9)  # a direction, not a constant: LayerNorm would erase a constant
    return np.abs(np.asarray(f(x.at[0, chunk, frame].add(kick)) - f(x))).max(axis=(0, -1))


def test_attention_block_sees_its_chunk_and_the_neighbours_halo_frames():
    dim, halo = 8, 2
    block = perturb(AttentionBlock(dim, 2, 2, halo, C, 0.0, jnp.float32, jnp.float32, rngs=nnx.Rngs(0)))
    f = nnx.jit(lambda b, x: b(x, chunk_windows))
    x = features((1, 5, C, dim))
    for frame, reached in [(0, [1, 2]), (C // 2, [2]), (C - 1, [2, 3])]:  # into chunk 1's / 3's halo
        changed = frame_influence(lambda x: f(block, x), x, 2, frame).max(axis=1)
        assert (changed[reached] > 1e-4).all(), (frame, changed)
        np.testing.assert_array_equal(np.delete(changed, reached), 0.0)


def test_models_are_local_in_time():
    n, x = 7, features((1, 7, C, F))
    # Transformer: one chunk further per block (2·depth blocks) -> chunks 3±2 at most.
    changed = frame_influence(lambda x: apply(perturb(model("transformer")), x), x, 3, 0).max(axis=1)
    assert changed[1] > 1e-4 and changed[[0, 6]].max() == 0.0, changed
    # Conv net: kernel // 2 = 2 frames per block (2 blocks), widened by the bottleneck's 2-frame groups.
    changed = frame_influence(lambda x: apply(perturb(model("tconv")), x), x, 3, 0).reshape(n * C)
    t = 3 * C
    assert changed[t - 4] > 0 and changed[t + 4] > 0, changed.reshape(n, C)
    np.testing.assert_array_equal(changed[np.abs(np.arange(n * C) - t) > 4 + 1], 0.0)


@pytest.mark.parametrize("name", ["transformer", "tconv"])
def test_sharded_over_data_and_time_equals_unsharded(name):
    mesh = jax.make_mesh((2, 4), ("data", "time"), axis_types=(jax.sharding.AxisType.Auto,) * 2)
    x = features((2, 4, C, F))  # one chunk per device along 'time'
    xs = jax.device_put(x, NamedSharding(mesh, P("data", "time")))

    def outputs_and_grads(m, x):
        graph, params, rest = nnx.split(m, nnx.Param, ...)

        def loss(params, x):
            y = nnx.merge(graph, params, rest)(x)
            return jnp.mean(y**2 + y), y

        return jax.jit(jax.value_and_grad(loss, has_aux=True)).lower(params, x).compile(), params

    step, params = outputs_and_grads(perturb(model(name, mesh=mesh)), xs)
    (l_s, y_s), g_s = step(params, xs)
    (l_u, y_u), g_u = outputs_and_grads(perturb(model(name)), x)[0](params, x)
    np.testing.assert_allclose(y_s, y_u, atol=1e-5)
    np.testing.assert_allclose(l_s, l_u, rtol=1e-5)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-5), g_s, g_u)
    # Only halo frames cross devices (ppermutes); the sequence is never gathered, forward or backward.
    hlo = step.as_text()
    assert "collective-permute" in hlo and "all-gather" not in hlo


def test_rope_scores_depend_only_on_relative_position():
    q, k = features((5, 1, 4), 1), features((5, 1, 4), 2)
    p = jnp.arange(5) * 3 - 4
    score = lambda s: jnp.einsum("ihd,jhd->ij", rope(q, p + s, 40.0), rope(k, p[::-1] + s, 40.0))
    np.testing.assert_allclose(score(0), score(7), atol=1e-5)


@pytest.mark.parametrize("name", ["transformer", "tconv"])
def test_overfits_a_tiny_batch(name):
    m = model(name)
    x = features((2, 2, C, F), 3)
    opt = nnx.Optimizer(m, optax.adam(1e-2), wrt=nnx.Param)

    @nnx.jit
    def step(m, opt):
        loss, grads = nnx.value_and_grad(lambda m: jnp.mean((m(x) - x) ** 2))(m)
        opt.update(m, grads)
        return loss

    losses = [float(step(m, opt)) for _ in range(25)]
    assert losses[-1] < 0.1 * losses[0], losses[::5]


def test_config_errors_are_clear():
    with pytest.raises(ValueError, match="unknown model.name"):
        model("rnn")
    with pytest.raises(ValueError, match="stride 3 must divide"):
        model("tconv", stride=3)
    with pytest.raises(ValueError, match="halo 9"):
        model("transformer", halo=9)(features((1, 2, C, F)))
    assert isinstance(model("transformer"), models.MotionTransformer)
    assert isinstance(model("tconv"), models.TemporalConvNet)


@pytest.mark.parametrize("name", ["transformer", "tconv"])
def test_staged_bottleneck_is_the_only_path_from_input_to_output(name):
    """stages=2 (2x then 2x): the latent is [B, N, C/4, latent]; with residual=False the output is
    decode(encode(x)) and an input change reaches the output only through the latent."""
    m = perturb(model(name, stride=4, stages=2, latent_dim=8))
    assert m.strides == (2, 2) and m.latent_per_frame == 2
    x = features((2, 2, C, F), 1)
    z = nnx.jit(lambda m, x: m.encode(x))(m, x)
    assert z.shape == (2, 2, C // 4, 8)
    np.testing.assert_allclose(apply(m, x), nnx.jit(lambda m, z: m.decode(z))(m, z), atol=1e-6)
    # The Jacobian of the output w.r.t. the input factors through the 8-number latent per 4 frames:
    # its rank over one chunk is at most the chunk's latent size.
    graphdef, state = nnx.split(m)
    jac = jax.jit(jax.jacobian(lambda v: nnx.merge(graphdef, state)(v.reshape(1, 1, C, F)).reshape(-1)))(
        x[:1, :1].reshape(-1))  # jitted: op by op, the transformer's Jacobian took ~15 s
    assert np.linalg.matrix_rank(np.asarray(jac), tol=1e-4) <= (C // 4) * 8
    with pytest.raises(ValueError, match="integer power"):
        model(name, stride=4, stages=3)


def _kinematics(input_positions=False, global_rotations=False):
    from motionjax.core.skeleton import deepmimic_humanoid
    pytest.importorskip("pybullet")  # the DeepMimic humanoid's URDF ships with it
    sk = deepmimic_humanoid()
    f = 3 + 6 * len(models.rotating_joints(sk))
    rng = np.random.default_rng(0)
    mean, std = rng.normal(size=f).astype(np.float32) * 0.1, rng.uniform(0.5, 2, f).astype(np.float32)
    return sk, f, models.SkeletonLayer(sk, mean, std, input_positions, global_rotations)


def test_global_rotations_map_to_the_local_rotations_of_the_same_pose():
    """Local features computed from world rotations equal the encoding of the local rotations
    (independent reference: quaternion FK's world rotations of random local rotations)."""
    from motionjax.core import features as feat
    from motionjax.core import rotations as rot
    from motionjax.core.kinematics import forward_kinematics
    sk, f, kin = _kinematics(global_rotations=True)
    rng = np.random.default_rng(1)
    q = rot.quat_normalize(rng.normal(size=(3, sk.num_joints, 4)))
    q[:, [k == "fixed" for k in sk.kinds]] = [1, 0, 0, 0]
    q = np.asarray(feat.unpack(sk, feat.pack(sk, np.zeros((3, 3)), q))[1])  # hinges as features see them
    _, world = forward_kinematics(sk, q, np.zeros((3, 3)))
    ids = models.rotating_joints(sk)
    got = kin.local_features(jnp.asarray(rot.quat_to_6d(np.asarray(world)[:, ids])))
    want = feat.standardize(feat.pack(sk, np.zeros((3, 3)), q), kin.mean, kin.std)[:, 3:]
    np.testing.assert_allclose(np.asarray(got), want, atol=2e-4)


def test_position_head_output_reaches_the_corrected_positions():
    """``SkeletonLayer.project``: rotation features (the hint) plus a position correction give rotations
    whose FK lands on FK(hint) + correction (independent reference: FK of a second random pose on
    an all-ball body; the correction is the difference of the two poses' positions), and a zero
    correction gives the hint back."""
    from motionjax.core import features as feat
    from motionjax.core import rotations as rot
    from motionjax.core.kinematics import forward_kinematics
    from motionjax.core.skeleton import smpl_like
    sk = smpl_like()
    f = 3 + 6 * len(models.rotating_joints(sk))
    rng = np.random.default_rng(3)
    mean, std = rng.normal(size=f).astype(np.float32) * 0.1, rng.uniform(0.5, 2, f).astype(np.float32)
    kin = models.SkeletonLayer(sk, mean, std, position_head=True)
    hint, true = (rot.quat_normalize(rng.normal(size=(5, sk.num_joints, 4))).astype(np.float32)
                  for _ in range(2))
    # Jitted: op by op, FK dispatched (and compiled) dozens of small programs.
    jit_fk = jax.jit(lambda q: forward_kinematics(sk, q, jnp.zeros((5, 3)))[0])
    fk = lambda q: np.asarray(jit_fk(jnp.asarray(q, jnp.float32)))
    x = feat.standardize(feat.pack(sk, np.zeros((5, 3), np.float32), hint), mean, std)[:, 3:]
    project = jax.jit(kin.project)
    for want in (true, hint):
        correction = (fk(want) - fk(hint)).reshape(5, -1) / models.POSITION_SCALE
        out = np.asarray(project(jnp.asarray(x), jnp.asarray(correction)))
        got = feat.unpack(sk, feat.destandardize(np.pad(out, [(0, 0), (3, 0)]), mean, std))[1]
        np.testing.assert_allclose(fk(got), fk(want), atol=2e-5)
    np.testing.assert_allclose(np.abs(np.sum(np.asarray(got) * hint, -1)), 1.0, atol=1e-5)
    with pytest.raises(ValueError, match="pick one"):
        models.SkeletonLayer(sk, mean, std, global_rotations=True, position_head=True)


def test_input_positions_are_root_relative_fk_positions():
    from motionjax.core import features as feat
    from motionjax.core import rotations as rot
    from motionjax.core.kinematics import forward_kinematics
    sk, f, kin = _kinematics(input_positions=True)
    rng = np.random.default_rng(2)
    q = rot.quat_normalize(rng.normal(size=(4, sk.num_joints, 4)))
    root = rng.normal(size=(4, 3))
    x = feat.standardize(feat.pack(sk, root, q), kin.mean, kin.std).astype(np.float32)
    pos, _ = forward_kinematics(sk, np.asarray(feat.unpack(sk, feat.pack(sk, root, q))[1]), root)
    want = (pos - pos[:, :1]).reshape(4, -1) / models.POSITION_SCALE
    np.testing.assert_allclose(np.asarray(kin.positions(jnp.asarray(x))), want, atol=1e-4)
    assert kin.extra_inputs == 3 * sk.num_joints


def test_highpass_correction_ignores_the_pose_and_sees_a_moving_average_residue():
    """highpass=k: the correction depends on x minus its centred k-frame moving average only (numpy
    reference over the whole sequence, fewer frames at the ends), so a pose held constant over
    time is passed through untouched by the correction."""
    m = perturb(model("tconv", residual=True, highpass=5, stride=1, latent_dim=16))
    x = features((2, 3, C, F), 4)
    seq = np.asarray(x).reshape(2, 3 * C, F)
    avg = np.stack([seq[:, max(t - 2, 0):t + 3].mean(1) for t in range(3 * C)], 1)
    got = nnx.jit(lambda m, x: m.highpass(x))(m, x)
    np.testing.assert_allclose(np.asarray(got).reshape(seq.shape), seq - avg, atol=1e-5)
    pose = features((1, 1, 1, F), 5)
    np.testing.assert_allclose(apply(m, x + pose) - (x + pose), apply(m, x) - x, atol=1e-4)
    with pytest.raises(ValueError, match="highpass"):
        model("tconv", residual=False, highpass=5)


@pytest.mark.parametrize("module,variant,per_frame", [
    ("autoencoder", "bandai,runlocal", 16), ("autoencoder", "deepmimic,8,runlocal", 8),
    ("autoencoder", "4,runlocal", 4), ("bandai_denoise", "runlocal", None),
    ("deepmimic_denoise", "runlocal", None)])
def test_task_configs_state_their_bottleneck_and_skip(module, variant, per_frame):
    """The autoencoders have no skip and the stated numbers per frame; the denoisers' skip sees the
    input's high-frequency content only."""
    import importlib

    from motionjax.core.skeleton import deepmimic_humanoid
    from motionjax.data.info import stand_in
    pytest.importorskip("pybullet")  # the DeepMimic humanoid's URDF ships with it
    config = importlib.import_module(f"experiments.{module}").get_config(variant)
    info = stand_in(deepmimic_humanoid())  # a real skeleton: models that see FK positions need one
    f = info.feature_dim
    m = make_model(config.model, f, config.data.chunk, nnx.Rngs(0), info=info)
    if per_frame is not None:
        assert not m.residual and m.latent_per_frame == per_frame and config.data.rot_noise == 0
    else:
        assert m.residual and m.highpass_frames > 0 and config.data.rot_noise > 0
    x = features((2, config.data.window // config.data.chunk, config.data.chunk, f))
    # Traced at the config's window, not compiled: the shapes are the claim (five configs' programs
    # compiled only for this; each model kind runs in the tests above).
    y = nnx.eval_shape(lambda m, x: m(x), m, x)
    assert y.shape == x.shape and y.dtype == jnp.float32


def test_interp_upsampling_is_linear_interpolation_across_chunks_and_devices():
    """``upsample="interp"``: coarse vectors at group centres, fine frames linearly interpolated
    between them (np.interp, ends held), the same whether the chunks sit on one device or four."""
    m = model("tconv", stride=4, stages=2, upsample="interp")
    n, c, k = 4, 4, 2  # 4 chunks of 4 coarse vectors, upsampled 2x
    coarse = features((2, n * c, 3), 3)
    h = coarse.reshape(2, n, c, 3)
    centres = np.arange(n * c) * k + (k - 1) / 2  # fine-frame position of each coarse vector
    fine = np.arange(n * c * k)
    expected = np.array([[np.interp(fine, centres, np.asarray(coarse)[b, :, d]) for d in range(3)]
                         for b in range(2)]).transpose(0, 2, 1).reshape(2, n, c * k, 3)
    np.testing.assert_allclose(m._interpolate(h, k), expected, atol=1e-6)
    mesh = jax.make_mesh((2, 4), ("data", "time"), axis_types=(jax.sharding.AxisType.Auto,) * 2)
    sharded = model("tconv", mesh=mesh, stride=4, stages=2, upsample="interp")
    hs = jax.device_put(h, NamedSharding(mesh, P("data", "time")))
    np.testing.assert_allclose(jax.jit(lambda h: sharded._interpolate(h, k))(hs), expected, atol=1e-6)
    # The whole model runs end to end with it, and the option is checked.
    assert apply(perturb(m), features((2, 2, C, F))).shape == (2, 2, C, F)
    with pytest.raises(ValueError, match="upsample"):
        model("tconv", upsample="cubic")


@pytest.mark.parametrize("name", ["transformer", "tconv"])
def test_dropout_is_random_in_training_and_off_in_evaluation(name):
    """``model.dropout``: two training-mode calls drop different units (the RNG advances), while eval
    mode is deterministic and equals the same weights with dropout 0."""
    x = features((2, 4, C, F))
    m = perturb(model(name, dropout=0.5))
    plain = model(name, dropout=0.0)
    nnx.update(plain, nnx.state(m, nnx.Param))
    m.train()
    first, second = np.asarray(m(x)), np.asarray(m(x))
    assert not np.allclose(first, second)
    m.eval()
    np.testing.assert_allclose(np.asarray(m(x)), np.asarray(m(x)))
    np.testing.assert_allclose(np.asarray(m(x)), np.asarray(plain(x)), rtol=1e-5, atol=1e-6)
