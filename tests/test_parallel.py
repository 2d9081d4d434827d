"""Mesh construction, the logical-axis rule table, and per-host batch assembly (8 CPU devices)."""
import math

import jax
import ml_collections
import numpy as np
import pytest
from jax.sharding import AxisType
from jax.sharding import PartitionSpec as P

from motionjax import parallel
from motionjax.train import diagnostics


def _mesh_config(shape):
    return ml_collections.ConfigDict(dict(shape=shape, across_hosts="data"))


@pytest.mark.parametrize(
    "shape, n, expected",
    [
        ((("data", -1), ("time", 1)), 8, {"data": 8, "time": 1}),
        ((("data", -1), ("time", 2)), 8, {"data": 4, "time": 2}),
        ((("data", 2), ("time", -1)), 8, {"data": 2, "time": 4}),
        ((("data", 2), ("time", 4)), 8, {"data": 2, "time": 4}),
        ((("data", -1),), 1, {"data": 1}),
    ],
)
def test_mesh_shape_fills(shape, n, expected):
    assert parallel.mesh_shape(shape, n) == expected


@pytest.mark.parametrize(
    "shape, match",
    [
        ((("data", -1), ("time", 3)), "does not divide"),
        ((("data", 2), ("time", 2)), "uses 4 of 8"),
        ((("data", -1), ("time", -1)), "at most one -1"),
        ((("data", 0), ("time", -1)), "positive"),
        ((("data", -1), ("data", 1)), "repeated"),
    ],
)
def test_mesh_shape_rejects_impossible(shape, match):
    with pytest.raises(ValueError, match=match):
        parallel.mesh_shape(shape, 8)


def test_make_mesh_axes_devices_and_types():
    mesh = parallel.make_mesh(_mesh_config((("data", -1), ("time", 2))))
    assert dict(mesh.shape) == {"data": 4, "time": 2}
    assert mesh.axis_types == (AxisType.Auto, AxisType.Auto)
    assert sorted(d.id for d in mesh.devices.flat) == sorted(d.id for d in jax.devices())
    one = parallel.make_mesh(_mesh_config((("data", -1), ("time", 1))), devices=jax.devices()[:1])
    assert dict(one.shape) == {"data": 1, "time": 1}


def test_logical_rules():
    assert parallel.logical_to_mesh(("batch", "chunk", "frame", "feature")) == P("data", "time", None, None)
    assert parallel.logical_to_mesh(("batch", "time", "joint", None)) == P("data", "time", None, None)
    # A mesh axis is used at most once per array.
    assert parallel.logical_to_mesh(("chunk", "time")) == P("time", None)
    with pytest.raises(KeyError, match="unknown logical axes"):
        parallel.logical_to_mesh(("batch", "chunks"))
    with pytest.raises(KeyError, match="unknown logical axes"):  # parameters are placed by param_sharding
        parallel.logical_to_mesh(("embed", "mlp"))


def test_param_sharding_fsdp():
    mesh = parallel.make_mesh(_mesh_config((("data", -1), ("time", 2))))
    assert parallel.param_sharding(mesh, (256, 96)).spec == P()
    assert parallel.param_sharding(mesh, (256, 96), fsdp=True).spec == P("data", None)
    assert parallel.param_sharding(mesh, (6, 1024), fsdp=True).spec == P(None, "data")
    assert parallel.param_sharding(mesh, (96,), fsdp=True).spec == P()  # too small to be worth it
    assert parallel.param_sharding(mesh, (4099, 3), fsdp=True).spec == P()  # no dim divisible by 4


def test_global_batch_layout():
    mesh = parallel.make_mesh(_mesh_config((("data", -1), ("time", 2))))
    windows = np.arange(8 * 4 * 2 * 3, dtype=np.float32).reshape(8, 4, 2, 3)  # [B, N, C, F]
    batch = parallel.global_batch({"x": windows, "w": np.arange(8.0), "stats": np.ones((8, 5))}, mesh)
    assert batch["x"].sharding.spec == P("data", "time", None, None)
    assert batch["w"].sharding.spec == P("data")
    assert batch["stats"].sharding.spec == P("data", None)
    np.testing.assert_array_equal(np.asarray(batch["x"]), windows)
    # Each device holds its data row's windows and its time column's chunks.
    for shard in batch["x"].addressable_shards:
        np.testing.assert_array_equal(shard.data, windows[shard.index])
        assert shard.data.shape == (2, 2, 2, 3)


def test_initialize_is_noop_for_one_process(monkeypatch):
    for var in ("JAX_NUM_PROCESSES", "SLURM_NTASKS", "OMPI_COMM_WORLD_SIZE"):
        monkeypatch.delenv(var, raising=False)
    parallel.initialize()
    assert not jax.distributed.is_initialized()
    assert jax.process_count() == 1 and parallel.is_main_process()


def test_collectives_read_from_compiled_hlo():
    """Explicit psum / all_gather / ppermute / psum_scatter come back with their mesh axes and sizes."""
    mesh = parallel.make_mesh(_mesh_config((("data", -1), ("time", 2))))

    def body(x):  # local x [2, 8] f32 = 64 bytes
        summed = jax.lax.psum(x, "data")
        gathered = jax.lax.all_gather(x, "time", tiled=True)  # [4, 8]
        shifted = jax.lax.ppermute(x, "time", [(0, 1), (1, 0)])
        scattered = jax.lax.psum_scatter(x * 3.0, ("data", "time"), scatter_dimension=1, tiled=True)  # [2, 1]
        return summed.sum() + gathered.sum() + shifted.sum() + scattered.sum()

    f = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=P("data", "time"), out_specs=P(), check_vma=False))
    found = diagnostics.collectives(f.lower(np.ones((8, 16), np.float32)).compile().as_text(), mesh)
    by_op = {}
    for c in found:
        by_op.setdefault(c.op, []).append(c)
    (gather,) = by_op["all-gather"]
    assert (gather.axes, gather.group_size, gather.result_bytes, gather.wire_bytes) == (("time",), 2, 128, 64)
    (permute,) = by_op["collective-permute"]
    assert (permute.axes, permute.group_size, permute.result_bytes) == (("time",), 2, 64)
    psums = [c for c in by_op["all-reduce"] if c.result_bytes == 64]
    assert [(c.axes, c.group_size) for c in psums] == [(("data",), 4)]
    assert psums[0].wire_bytes == 2 * 3 / 4 * 64
    (scatter,) = by_op["reduce-scatter"]
    assert (scatter.axes, scatter.group_size, scatter.result_bytes) == (("data", "time"), 8, 8)


def test_iota_replica_groups():
    line = "x = f32[4]{0} all-reduce(y), replica_groups=[2,4]<=[4,2]T(1,0), to_apply=add"
    assert diagnostics._groups(line) == [[0, 2, 4, 6], [1, 3, 5, 7]]
    line = "x = f32[4]{0} all-reduce(y), replica_groups=[4,2]<=[8]"
    assert diagnostics._groups(line) == [[0, 1], [2, 3], [4, 5], [6, 7]]


def _tiny_config(mesh_shape):
    from motionjax.configs import base

    config = base.get_config()
    config.mesh.shape = mesh_shape
    config.data.batch_size, config.data.window, config.data.chunk = 8, 32, 8
    config.model.update(dim=32, depth=1, heads=2, halo=4, latent_dim=8, stride=2)
    return config


@pytest.mark.parametrize("model", ["transformer", "tconv"])
def test_train_step_communication(model):
    """The compiled train step on a 4 x 2 (data x time) mesh sends only what it must.

    Gradients: all-reduced, over 'data' and over 'time' (each time shard holds different frames,
    so each holds a partial gradient). Halos: collective-permutes over 'time' only. Nothing is
    gathered: no all-gather / all-to-all / reduce-scatter, so the sequence never comes together.
    """
    from motionjax import train
    from motionjax.data import synthetic

    config = _tiny_config((("data", 4), ("time", 2)))
    config.model.name = model
    if model == "tconv":  # the loss's collectives (dynamics term included) are the transformer case's
        config.loss.dynamics_weight = 0.0  # and it is most of the compile time
    mesh = parallel.make_mesh(config.mesh)
    info = synthetic.synthetic_info(4, window=config.data.window, frames=64)
    lowered, state = train.lower_train_step(config, info, mesh)
    found = diagnostics.collectives(lowered.compile().as_text(), mesh)

    param_bytes = sum(math.prod(x.shape) * x.dtype.itemsize for x in jax.tree.leaves(state["params"]))
    assert not [c for c in found if c.op not in ("all-reduce", "collective-permute")]
    permutes = [c for c in found if c.op == "collective-permute"]
    assert permutes and all(c.axes == ("time",) for c in permutes)
    reduces = [c for c in found if c.op == "all-reduce"]
    # Every gradient is summed over both axes (one all-reduce over both, or one per axis).
    for axis in ("data", "time"):
        assert sum(c.result_bytes for c in reduces if axis in c.axes) >= param_bytes, axis
    # The rest are scalar metrics.
    assert sum(c.result_bytes for c in reduces) <= 2 * param_bytes + 1024


def test_put_matches_device_put():
    mesh = parallel.make_mesh(_mesh_config((("data", -1), ("time", 2))))
    tree = {"w": np.arange(64 * 128, dtype=np.float32).reshape(64, 128), "key": jax.random.key(3),
            "step": np.int32(7)}
    shardings = {"w": parallel.param_sharding(mesh, (64, 128), fsdp=True), "key": parallel.replicated(mesh),
                 "step": parallel.replicated(mesh)}
    put, ref = parallel.put(tree, shardings), jax.device_put(tree, shardings)
    for k in tree:
        assert put[k].sharding == ref[k].sharding
    np.testing.assert_array_equal(put["w"], ref["w"])
    np.testing.assert_array_equal(jax.random.key_data(put["key"]), jax.random.key_data(ref["key"]))
    assert jax.random.key_impl(put["key"]) == jax.random.key_impl(ref["key"])


@pytest.mark.parametrize("dtype, nbytes", [(np.float32, 4), (jax.numpy.bfloat16, 2)])
def test_gradient_reduction_follows_compute_dtype(dtype, nbytes):
    """Weight gradients are all-reduced over 'data' in the dtype of the matmul that made them.

    Read from the partitioned HLO: the CPU executable itself always reduces in f32.
    """
    mesh = parallel.make_mesh(_mesh_config((("data", -1), ("time", 1))))

    def loss(w, x):
        return jax.numpy.sum(jax.numpy.tanh(x.astype(dtype) @ w.astype(dtype)).astype(np.float32))

    grad = jax.jit(jax.grad(loss), in_shardings=(parallel.replicated(mesh), parallel.batch_sharding(mesh, 2)),
                   out_shardings=parallel.replicated(mesh))
    compiled, partitioned = diagnostics.compile_partitioned(grad.lower(np.ones((64, 32), np.float32),
                                                                    np.ones((16, 64), np.float32)))
    (reduce,) = diagnostics.collectives(partitioned, mesh)
    assert (reduce.op, reduce.axes, reduce.result_bytes) == ("all-reduce", ("data",), 64 * 32 * nbytes)
    (executed,) = diagnostics.collectives(compiled.as_text(), mesh)
    assert (executed.dtype, executed.result_bytes) == ("f32", 64 * 32 * 4)


