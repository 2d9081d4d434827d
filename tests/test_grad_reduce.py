"""The gradient sum over ``data`` (``train.grad_reduce*``, issue #27), on 8 virtual CPU devices: the
compressed and two-level sums against numpy, error feedback's exact bookkeeping, the bytes on the
wire and across hosts read back from the HLO, which collectives can overlap the backward pass, and
whole train steps against XLA's own fp32 all-reduce, with an exact checkpoint round trip."""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
import pytest
from jax.sharding import PartitionSpec as P

from experiments import deepmimic_denoise
from motionjax import parallel, train
from motionjax.core import reduce
from motionjax.data import synthetic
from motionjax.train import checks, diagnostics, grad_reduce

N, L = 8, 8 * reduce.BLOCK * 2  # devices on 'data'; elements of one gradient bucket


def _mesh(data=N, time=1):
    config = deepmimic_denoise.get_config("runlocal").mesh
    config.shape = (("data", data), ("time", time))
    return parallel.make_mesh(config, jax.devices()[: data * time])


@functools.cache
def _sum(wire: str, hosts: int = 0, ordered: bool = False):
    """jit(x [8, L], worker, server) -> (sum [L], worker, server): one device's bucket per row of x;
    ``hosts`` > 0: two levels over ``hosts`` blocks of devices."""
    mesh = _mesh()

    def body(x, worker, server):
        if hosts:
            out = reduce.two_level_psum(x[0], worker[0], server[0], wire, "data", hosts, ordered)
        else:
            out = reduce.compressed_psum(x[0], worker[0], server[0], wire, "data", ordered=ordered)
        return out[0], out[1][None], out[2][None]

    return jax.jit(jax.shard_map(body, mesh=mesh, in_specs=P("data"), out_specs=(P(), P("data"), P("data")),
                                 check_vma=False)), mesh


def _zeros(hosts: int = 0):
    return np.zeros((N, L // (N // hosts if hosts else 1)), np.float32), np.zeros((N, L // N), np.float32)


def _sent(wire, hosts=0):
    """The collectives of the compiled sum, read from its partitioned HLO."""
    fn, mesh = _sum(wire, hosts)
    x = jax.ShapeDtypeStruct((N, L), np.float32)
    worker, server = (jax.ShapeDtypeStruct(a.shape, a.dtype) for a in _zeros(hosts))
    _, hlo = diagnostics.compile_partitioned(fn.lower(x, worker, server))
    return [c for c in diagnostics.collectives(hlo, mesh) if c.group_size > 1]


def test_sums_equal_numpy_and_two_levels_cut_the_cross_host_bytes_by_the_devices_per_host():
    x = np.random.default_rng(0).normal(size=(N, L)).astype(np.float32)
    exact = x.astype(np.float64).sum(0)
    for hosts in (0, 2):
        got, *_ = _sum("fp32", hosts)[0](x, *_zeros(hosts))
        np.testing.assert_allclose(got, exact, rtol=1e-6, atol=1e-5)
        for wire, tol in (("bf16", 2**-8), ("int8", 1 / 127)):
            got, *_ = _sum(wire, hosts)[0](x, *_zeros(hosts))
            # One rounding of each device's value and one of the sum: relative to the block's max.
            assert np.max(np.abs(got - exact)) < 2 * tol * N * np.max(np.abs(x)), (wire, hosts)
    # Ordered fp32: each slice summed on its owner, row by row in device order: numpy's float32 adds
    # in that order, bit for bit (flat; and over 4 hosts of 2, whose in-host sum is one addition).
    for hosts in (0, 4):
        ordered, *_ = _sum("fp32", hosts, ordered=True)[0](x, *_zeros(hosts))
        rows = x if not hosts else x[0::2] + x[1::2]
        expect = rows[0].copy()
        for row in rows[1:]:
            expect += row
        np.testing.assert_array_equal(ordered, expect)
    # Wire format: all-to-all + all-gather of int8 (with block scales) / bf16 against fp32 ring sums.
    fp32 = sum(c.wire_bytes for c in _sent("fp32"))
    assert {c.dtype for c in _sent("int8")} == {"s8"} and {c.dtype for c in _sent("bf16")} == {"bf16"}
    assert len(_sent("int8")) == 2  # one all-to-all, one all-gather: the scales ride in the int8 messages
    assert 1.95 < fp32 / sum(c.wire_bytes for c in _sent("bf16")) < 2.05
    assert 3.8 < fp32 / sum(c.wire_bytes for c in _sent("int8")) < 4.0
    # 2 hosts x 4 devices: only the across-host stage crosses the host boundary, with 1/4 of the bucket.
    for wire in ("fp32", "int8"):
        flat = sum(c.wire_bytes for c in _sent(wire) if c.crosses(N // 2))
        two = [c for c in _sent(wire, hosts=2) if c.crosses(N // 2)]
        assert two and all(c.group_size == 2 for c in two)
        assert flat / sum(c.wire_bytes for c in two) >= N // 2, wire


@pytest.mark.parametrize("wire, hosts", [("int8", 0), ("bf16", 0), ("int8", 2)])
def test_error_feedback_keeps_the_compressed_sum_on_the_exact_one(wire, hosts):
    """K steps of gradients whose small entries sit below half a quantization step of their block (a
    large entry sets the scale): without feedback they are lost every step and the summed updates
    drift linearly with K; with it, outputs + residuals sum exactly to the exact sum (telescoping),
    and the residuals stay within half a step of each compression, so the drift is bounded."""
    rng = np.random.default_rng(1)
    fn, _ = _sum(wire, hosts)
    steps, big = 60, 1.5
    base = np.full((N, L), 2e-3, np.float32)
    base[:, :: reduce.BLOCK] = 1.0  # one large entry per block sets its int8 scale
    total, total_off, exact = np.zeros(L), np.zeros(L), np.zeros(L)
    worker, server = _zeros(hosts)
    for _ in range(steps):
        g = base * rng.uniform(0.5, big, size=(N, L)).astype(np.float32)
        out, worker, server = fn(g, worker, server)
        total += np.asarray(out, np.float64)
        total_off += np.asarray(fn(g, *_zeros(hosts))[0], np.float64)  # residuals dropped each step
        exact += g.astype(np.float64).sum(0)
    worker, server = np.asarray(worker, np.float64), np.asarray(server, np.float64)
    # What is still owed, laid out like the bucket: server rows own 1/N slices; two levels: device
    # h*d + i owns chunk h of slice i of its host's sum, and worker rows hold host-summed slices.
    if hosts:
        d = N // hosts
        owed = server.reshape(hosts, d, -1).transpose(1, 0, 2).reshape(-1)
        owed = owed + np.stack([worker[h * d:(h + 1) * d].reshape(-1) for h in range(hosts)]).sum(0)
    else:
        owed = server.reshape(-1) + worker.sum(0)
    np.testing.assert_allclose(total + owed, exact, rtol=1e-5, atol=1e-4)
    half_step = {"int8": 1 / 254, "bf16": 2**-9}[wire]  # of a block's (int8) or a value's (bf16) max
    drift, drift_off = np.max(np.abs(total - exact)), np.max(np.abs(total_off - exact))
    assert drift <= 2 * N * big * half_step * 1.01, drift  # devices' rounding + the owner's
    if wire == "int8":  # bf16 rounds each value to nearest: no systematic loss to show
        assert drift_off > 10 * drift, (drift_off, drift)


# --------------------------------------------------------------------------------------------
# Whole train steps
# --------------------------------------------------------------------------------------------
def _config(data=N, time=1, **train_overrides):
    config = deepmimic_denoise.get_config("runlocal")
    config.mesh.shape = (("data", data), ("time", time))
    config.model.dtype = "float32"  # fp32 compute: XLA's all-reduce is then fp32 too (the reference)
    config.train.grad_bucket_mb = 0.01  # ~2.6k elements: several buckets even for this tiny model
    config.train.update(train_overrides)
    return config


@pytest.fixture(scope="module")
def info():
    config = _config()
    return synthetic.synthetic_info(4, window=config.data.window, frames=2 * config.data.window)


@pytest.fixture(scope="module")
def batches(info):
    config = _config()
    abstract = train.abstract_batch(config, info, _mesh())
    rng = np.random.default_rng(0)
    valid = np.ones(abstract["valid"].shape, np.float32)
    valid[:, -1, -3:] = 0.0  # a few padding frames at the end of every window
    # Each window's own bones (data.bones = "clip"): the skeleton's, a little longer or shorter.
    offsets = info.skeleton.offsets[None] * rng.uniform(0.9, 1.1, size=(len(valid), 1, 1))
    return [{"noisy": rng.normal(size=abstract["noisy"].shape).astype(np.float32),
             "clean": rng.normal(size=abstract["clean"].shape).astype(np.float32), "valid": valid,
             "offsets": offsets.astype(np.float32)} for _ in range(4)]


def _compiled(config, info, batches):
    """``(run, state, compiled, partitioned HLO, mesh)``: the config's train step compiled once; ``run(
    state, batches)`` -> (state, losses)."""
    mesh = parallel.make_mesh(config.mesh, jax.devices()[: int(np.prod([s for _, s in config.mesh.shape]))])
    step, state, shardings, _ = train.build_train_step(config, info, mesh)
    abstract = train.abstract_batch(config, info, mesh)
    compiled, hlo = diagnostics.compile_partitioned(step.lower(state, abstract))
    batch_shardings = parallel.batch_shardings(mesh, sorted(abstract))

    def run(state, batches):
        losses = []
        for b in batches:
            state, metrics = compiled(state, parallel.put({k: b[k] for k in abstract}, batch_shardings))
            losses.append(float(metrics["loss"]))
        return state, losses

    return run, state, compiled, hlo, mesh


@pytest.fixture(scope="module")
def xla_step(info, batches):
    return _compiled(_config(), info, batches)


def _copy(state):
    return jax.tree.map(jnp.copy, state)  # the step donates its state


def test_two_level_fp32_step_over_data_and_time_in_micro_batches_equals_xla_all_reduce(info, batches,
                                                                                       xla_step):
    """2 hosts x 2 data devices x 2 time shards, fp32, each device's 2 windows as 2 micro-batches: the
    explicit sum (both slices on the device, then time, inside the host, across, inside) gives XLA's
    all-reduce of the whole batch on the 8 x 1 mesh: losses and parameters to ~1e-6 (every slice has
    as many real frames). The gradient's collectives run once a step, outside the loop over slices,
    and some bucket can overlap the last slice's backward pass."""
    run, state, *_ = xla_step
    ref, ref_losses = run(_copy(state), batches[:3])
    config = _config(data=4, time=2, grad_reduce_levels=2, grad_reduce_host_size=2, micro_batches=2)
    run2, state2, compiled, hlo, mesh = _compiled(config, info, batches)
    assert "grad_residual" not in state2  # fp32: nothing to feed back
    got, losses = run2(state2, batches[:3])
    np.testing.assert_allclose(losses, ref_losses, rtol=1e-6)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6), got["params"],
                 ref["params"])
    ops = {(c.op, c.group_size) for c in diagnostics.collectives(hlo, mesh) if "data" in c.axes}
    assert {("reduce-scatter", 2), ("all-gather", 2)} <= ops  # inside each host
    plan = grad_reduce.make_plan(config.train, mesh, state2["params"])
    assert "once per 2 micro-batches" in plan.describe()
    # In the loop: the slices' halo exchanges over time and loss sums over data, no gradient.
    looped = diagnostics.looped_collectives(hlo, mesh)
    assert looped and not [c for c in looped if "data" in c.axes and c.result_bytes > 64], looped
    overlap = [f for c, _, f in diagnostics.overlap(compiled.as_text(), mesh) if c.result_bytes > 64]
    assert overlap and max(overlap) > 0, overlap


def test_int8_step_sends_a_quarter_overlaps_backward_and_resumes_exactly(tmp_path, info, batches, xla_step):
    """int8 with error feedback: ~4x fewer gradient bytes over data than XLA's fp32 all-reduce (read
    from the partitioned HLO); its bucket collectives have backward matmuls they neither wait for nor
    feed (XLA's combined all-reduce has none); the loss follows fp32's; and 2 steps, an orbax
    checkpoint, a restore into a fresh state and 2 more steps equal 4 uninterrupted steps bitwise,
    error-feedback residuals included."""
    _, xla_state, xla_compiled, xla_hlo, mesh = xla_step
    config = _config(grad_reduce="int8")
    run, state, compiled, hlo, mesh = _compiled(config, info, batches)
    grads = lambda h: sum(c.wire_bytes for c in diagnostics.collectives(h, mesh)  # noqa: E731
                          if "data" in c.axes and not (c.op == "all-reduce" and c.result_bytes <= 64))
    # Per element: XLA reduces the parameters, the buckets are padded to multiples of 8 x 256.
    plan = grad_reduce.make_plan(config.train, mesh, state["params"])
    fp32 = grads(xla_hlo) / sum(x.size for x in jax.tree.leaves(state["params"]))
    int8 = grads(hlo) / sum(plan.sizes)
    assert 3.7 < fp32 / int8 < 4.0, (fp32, int8)
    overlap = [(m, f) for c, m, f in diagnostics.overlap(compiled.as_text(), mesh) if c.op != "all-reduce"]
    assert len(overlap) >= 4 and max(overlap) > (0, 0), overlap
    # XLA's own step: one combined gradient all-reduce, after every matmul (the loss's scalars aside).
    xla = diagnostics.overlap(xla_compiled.as_text(), mesh)
    assert [(m, f) for c, m, f in xla if c.result_bytes > 64] == [(0, 0)], xla

    residual = jax.tree.leaves(state["grad_residual"])
    assert residual and all(r.sharding.spec == P("data") and r.shape[0] == N for r in residual)
    fresh = _copy(state)
    full, losses = run(_copy(state), batches)
    _, xla_losses = xla_step[0](_copy(xla_state), batches)
    np.testing.assert_allclose(losses, xla_losses, rtol=2e-2)
    assert any(np.abs(r).max() > 0 for r in jax.tree.leaves(full["grad_residual"]))

    half, _ = run(_copy(state), batches[:2])
    mngr = ocp.CheckpointManager(tmp_path / "checkpoints")
    train.save_checkpoint(mngr, 2, half, None, {})
    mngr.wait_until_finished()
    restored, _ = train.restore_checkpoint(mngr, 2, fresh)
    mngr.close()
    resumed, _ = run(restored, batches[2:])
    bits = lambda x: jax.random.key_data(x) if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key) else x  # noqa: E731
    jax.tree.map(lambda a, b: np.testing.assert_array_equal(bits(a), bits(b)), resumed, full)


def test_config_checks_name_what_an_explicit_reduction_cannot_do():
    config = _config(grad_reduce="int8", grad_reduce_levels=2, grad_reduce_host_size=3)
    config.mesh.fsdp = True
    config.model.dropout = 0.1
    with pytest.raises(checks.ConfigError) as e:
        checks.check_config(config, N)
    text = str(e.value)
    assert "mesh.fsdp" in text and "model.dropout" in text and "grad_reduce_host_size=3" in text
    with pytest.raises(checks.ConfigError, match="train.grad_reduce='int4'"):
        checks.check_config(_config(grad_reduce="int4"), N)
    checks.check_config(_config(grad_reduce="bf16", grad_reduce_levels=2, grad_reduce_host_size=4), N)
    with pytest.raises(checks.ConfigError, match="micro_batches=3: expected a divisor of the 2 windows"):
        checks.check_config(_config(data=4, time=2, micro_batches=3), N)
