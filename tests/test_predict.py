"""Forecasting (issue #28): the siMLPe-style model's DCT, the baselines against hand-computed motion,
the plausibility metrics on hand-computed cases, the input that never sees the future, and a tiny
``runlocal`` prediction run end to end."""
import types

import jax.numpy as jnp
import numpy as np
import pytest
import scipy.fft
from flax import nnx

from motionjax import configs, models
from motionjax.core import features
from motionjax.core import rotations as rot
from motionjax.core.kinematics import forward_kinematics
from motionjax.core.skeleton import deepmimic_humanoid
from motionjax.data import transforms
from motionjax.evaluation import forecast, metrics

SKELETON = deepmimic_humanoid()
F = features.feature_dim(SKELETON)
MEAN, STD = np.zeros(F, np.float32), np.ones(F, np.float32)  # features as they are
FPS = 30.0


def test_dct_matrix_is_scipys_orthonormal_dct_and_round_trips():
    x = np.random.default_rng(0).normal(size=(12, 5))
    d = models.dct_matrix(12)
    np.testing.assert_allclose(d @ x, scipy.fft.dct(x, type=2, norm="ortho", axis=0), atol=1e-5)
    np.testing.assert_allclose(d.T @ (d @ x), x, atol=1e-5)
    np.testing.assert_allclose(scipy.fft.idct(d @ x, type=2, norm="ortho", axis=0), x, atol=1e-5)


def _window(root, angles, joint: int):
    """Features ``[1, 1, T, F]`` of a motion: ``root [T, 3]`` and joint ``joint`` turning ``angles [T]``
    about z (every other joint at rest)."""
    t = len(root)
    quats = np.tile(rot.identity_quat((SKELETON.num_joints,), np.float64, np), (t, 1, 1))
    quats[:, joint] = rot.axis_angle_to_quat(np.outer(angles, [0.0, 0.0, 1.0]))
    return features.pack(SKELETON, np.asarray(root, np.float64), quats)[None, None].astype(np.float32)


def _decoded(x):
    root, quats = features.unpack(SKELETON, np.asarray(x, np.float64)[0, 0])
    return root, rot.quat_canonical(quats)


def test_zero_and_constant_velocity_equal_hand_computed_motion():
    # Observed: frames 0..2, root x 0, 1, 3 (last step +2) and the chest at 0, 0.1, 0.3 rad (last +0.2).
    root = np.zeros((5, 3))
    root[:3, 0] = [0.0, 1.0, 3.0]
    root[3:, 0] = [9.0, 9.0]  # the future: what the baselines must not read
    angles = np.array([0.0, 0.1, 0.3, 2.0, 2.0])
    x = _window(root, angles, joint=1)
    zero, const = forecast.zero_velocity(x, 3), forecast.constant_velocity(x, 3, SKELETON, MEAN, STD)
    np.testing.assert_array_equal(zero[0, 0, :3], x[0, 0, :3])
    np.testing.assert_array_equal(const[0, 0, :3], x[0, 0, :3])
    z_root, z_quats = _decoded(zero)
    np.testing.assert_allclose(z_root[3:, 0], [3.0, 3.0], atol=1e-6)
    np.testing.assert_allclose(z_quats[3:, 1], np.tile(_decoded(x)[1][2, 1], (2, 1)), atol=1e-6)
    c_root, c_quats = _decoded(const)
    np.testing.assert_allclose(c_root[3:, 0], [5.0, 7.0], atol=1e-5)  # 3 + 2k
    np.testing.assert_allclose(c_root[3:, 1:], 0.0, atol=1e-6)
    want = rot.quat_canonical(rot.axis_angle_to_quat(np.outer([0.5, 0.7], [0.0, 0.0, 1.0])))  # 0.3 + 0.2k
    np.testing.assert_allclose(c_quats[3:, 1], want, atol=1e-5)
    rest = [j for j in range(SKELETON.num_joints) if j != 1]
    np.testing.assert_allclose(c_quats[3:, rest, 0], 1.0, atol=1e-6)  # the other joints stay at rest


def test_foot_skate_and_floor_penetration_equal_a_hand_computed_case():
    """The true feet stand still; the predicted ones slide 0.6 m/s along x and sink 2 cm: skate 60 cm/s
    on the scored planted frames (the metric's own contact rule), penetration 2 cm per frame."""
    t, feet = 8, SKELETON.foot_joints
    rest = rot.identity_quat((1, t, SKELETON.num_joints), np.float32, np)
    true_root = np.zeros((1, t, 3), np.float32)
    true_root[..., 1] = 1.0
    true_pos = np.asarray(forward_kinematics(SKELETON, rest, true_root)[0])
    pred_root = true_root.copy()
    pred_root[..., 1] -= 0.02
    pred_root[..., 0] = np.arange(t) * 0.6 / FPS  # the whole body slides at 0.6 m/s
    pred_pos = np.asarray(forward_kinematics(SKELETON, rest, pred_root)[0])
    scored = transforms.forecast_frames(t, 4)[None]  # frames 4..7
    valid = np.ones((1, t), np.float32)
    m = metrics.metric_sums(SKELETON, FPS, pred_pos, true_pos, scored, 0.3)
    # Central differences count on frames 5 and 6 (their stencils inside the scored frames), per foot.
    np.testing.assert_allclose(m["foot_skate"][0], 60.0 * 2 * len(feet), rtol=1e-4)
    np.testing.assert_allclose(m["foot_skate"][1], 2 * len(feet))
    p = metrics.physics_sums(SKELETON, FPS, pred_root, rest, true_root, rest, valid, scored)
    np.testing.assert_allclose(p["penetration"][0] / p["penetration"][1], 2.0, rtol=1e-3)
    # Uniform motion and a body at rest carry the same forces (gravity only): no force error.
    np.testing.assert_allclose(p["force_error"][0], 0.0, atol=1e-3)
    assert p["force"][0] > 0  # gravity


def test_the_forecaster_reads_only_the_observed_frames():
    cfg = configs.load("experiments/predict.py:deepmimic,runlocal").model
    info = types.SimpleNamespace(skeleton=SKELETON, mean=MEAN, std=STD)  # for its FK position inputs
    model = models.make_model(cfg, F, 8, nnx.Rngs(0), info=info, observed=20)
    for block in model.blocks:  # nonzero weights everywhere (the head starts at zero)
        block.temporal.kernel.value += 0.1
    model.head.kernel.value = jnp.full(model.head.kernel.value.shape, 0.01)
    x = np.random.default_rng(0).normal(size=(2, 4, 8, F)).astype(np.float32)
    changed = x.copy().reshape(2, 32, F)
    changed[:, 20:] += 1.0
    out, out_changed = np.asarray(model(x)), np.asarray(model(changed.reshape(x.shape)))
    np.testing.assert_allclose(out, out_changed, atol=1e-6)
    np.testing.assert_array_equal(out.reshape(2, 32, F)[:, :20], x.reshape(2, 32, F)[:, :20])
    assert np.abs(out.reshape(2, 32, F)[:, 20:] - x.reshape(2, 32, F)[:, 19:20]).max() > 1e-3


def test_a_forecast_with_few_dct_coefficients_lies_in_their_span():
    cfg = configs.load("experiments/predict.py:deepmimic,runlocal").model
    cfg.update(input_positions=False, dct_keep=3)
    model = models.make_model(cfg, F, 8, nnx.Rngs(0), observed=20)
    model.head.kernel.value = jnp.asarray(np.random.default_rng(1).normal(size=model.head.kernel.value.shape))
    x = np.random.default_rng(0).normal(size=(1, 4, 8, F)).astype(np.float32)
    change = (np.asarray(model(x)) - x).reshape(32, F)[20:] - (x.reshape(32, F)[19] - x.reshape(32, F)[20:])
    basis = models.dct_matrix(20).T[:12, :3]  # the first 12 frames of the 3 lowest inverse-DCT vectors
    fit = basis @ np.linalg.lstsq(basis, change, rcond=None)[0]
    assert np.abs(change).max() > 1e-2
    np.testing.assert_allclose(fit, change, atol=1e-4)


def test_the_input_never_sees_the_future():
    """make_example with ``observed``: the input's later frames hold the last observed one and the
    window's floor comes from the observed frames, so changing the future changes no input number."""
    rng = np.random.default_rng(1)
    t, observed = 12, 8
    root = rng.normal(size=(t, 3)) * 0.1 + [0, 1, 0]
    quats = rot.axis_angle_to_quat(rng.normal(size=(t, SKELETON.num_joints, 3)) * 0.3)
    draws = transforms.Noise().sample(rng, t, SKELETON)
    make = lambda r: transforms.make_example(SKELETON, r, quats, draws, MEAN, STD, chunk_size=4,
                                             observed=observed)
    lowered = root.copy()
    lowered[observed:, 1] -= 0.5  # the future goes below the observed floor
    a, b = make(root), make(lowered)
    np.testing.assert_array_equal(a["noisy"], b["noisy"])
    noisy = a["noisy"].reshape(t, -1)
    np.testing.assert_array_equal(noisy[observed:], np.tile(noisy[observed - 1], (t - observed, 1)))
    np.testing.assert_array_equal(a["clean"].reshape(t, -1)[:observed], noisy[:observed])


@pytest.fixture(scope="module")
def forecaster(deepmimic_dir, tmp_path_factory):
    """A runlocal forecaster trained beside its siMLPe-style reference (``RUN/simlpe``). Its two tests are
    e2e (~45 CPU s, the experiment end to end in this process): make test keeps the forecaster's own tests
    above (the observed frames alone, the DCT span, no future in the input)."""
    from motionjax import train

    config = configs.load("experiments/predict.py:deepmimic,runlocal")
    config.data.dir = str(deepmimic_dir)
    workdir = tmp_path_factory.mktemp("forecaster") / "run"
    return workdir, train.run_experiment(config, workdir)


@pytest.mark.e2e
def test_a_runlocal_forecaster_trains_and_prints_its_horizon_table(forecaster, deepmimic_dir):
    workdir, summary = forecaster
    assert summary["status"] == "done" and summary["steps"] == 6
    rows = summary["results"]["test"]["clean"]
    assert {"model", "simlpe", "zero_velocity", "constant_velocity", "truth"} <= set(rows)
    # The reference trained too, with its own (smaller) model.
    assert (workdir / "simlpe" / "summary.json").exists()
    for method in ("model", "simlpe", "zero_velocity", "constant_velocity"):
        assert all(np.isfinite(rows[method][f"mpjpe_{h}ms"]) for h in (80, 160, 320, 400))
        assert rows[method]["mpjpe_400ms"] > rows[method]["mpjpe_80ms"] > 0  # errors grow with the horizon
    assert rows["truth"]["mpjpe"] == 0.0
    # The held-out scalars choose the checkpoint.
    assert "eval/validation/mpjpe" in summary["history"]
    table = "\n".join(summary["table"])  # what the trainer printed
    assert "zero_velocity" in table and "1000ms" not in table and "400ms" in table
    # scripts/evaluate.py's path: the restored best checkpoint scores test as the run's final table did.
    from motionjax.efficiency import trained
    from motionjax.evaluation import runs

    run = trained.load(workdir)
    assert run.step == summary["evaluated_step"]
    again = runs.evaluate(run, runs.corpus_for(run, deepmimic_dir), "test")["test"]["clean"]
    for method in ("model", "zero_velocity", "truth"):
        for key, value in _flat(rows[method]).items():  # the intervals and ratios too
            np.testing.assert_allclose(_flat(again[method])[key], value, rtol=1e-4, atol=1e-6,
                                       err_msg=f"{method} {key}")
    # Each number has its interval over the clips it averages, around it; the model's ratio to the held
    # pose is the ratio of the two rows' numbers.
    model, zero = rows["model"], rows["zero_velocity"]
    ci, ratio = model["intervals"]["mpjpe_400ms"], model["ratio_to_zero_velocity"]["mpjpe_400ms"]
    assert ci["lo"] <= model["mpjpe_400ms"] <= ci["hi"] and model["mpjpe_400ms"] == pytest.approx(ci["mean"])
    assert ci["clips"] == model["clips_400ms"]
    assert ratio["value"] == pytest.approx(model["mpjpe_400ms"] / zero["mpjpe_400ms"])
    assert "zero velocity's, paired per clip" in table


def _flat(row: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in row.items():
        out.update(_flat(v, f"{prefix}{k}/") if isinstance(v, dict) else {f"{prefix}{k}": v})
    return out


@pytest.mark.e2e
def test_someone_elses_bvh_folder_is_scored_whole_and_says_what_each_horizon_averages(forecaster, tmp_path):
    """A folder of BVH files as another lab hands it over: two copies of one take under the same file
    name in two folders, a take shorter than the 32-frame window (26 frames: it reaches the 80 and
    160 ms horizons, frames 21 and 24, not 320 and 400 ms), one no longer than the 20 observed frames,
    and a broken file. Every copy is scored (no dedup unless asked), the short ones and the broken one
    are named with their reasons, each horizon says how many clips it averages, and the siMLPe-style
    reference the run trained (RUN/simlpe) has its row."""
    from motionjax.efficiency import trained
    from motionjax.evaluation import evaluators, runs
    from motionjax.formats import Motion, deepmimic_clip_paths, load, write_bvh

    workdir, _ = forecaster
    take = load(next(p for p in deepmimic_clip_paths() if "getup_faceup" in p.name))  # 60 fps, 227 frames
    at_30 = lambda m, frames: Motion(m.skeleton, 30.0, m.root_position[::2][:frames],
                                     m.rotations[::2][:frames], name=m.name)
    folder = tmp_path / "theirs"
    for sub in ("a", "b"):
        (folder / sub).mkdir(parents=True)
        write_bvh(folder / sub / "getup.bvh", at_30(take, None))
    write_bvh(folder / "part.bvh", at_30(take, 26))
    write_bvh(folder / "tiny.bvh", at_30(take, 15))
    (folder / "broken.bvh").write_text("HIERARCHY\nROOT hips\n{\n")
    run = trained.load(workdir)
    lines = []
    info = runs.corpus_for(run, folder, "test", tmp_path / "cache", log=lines.append)
    assert sorted(info.names) == ["a/getup", "b/getup", "part", "tiny"]  # both copies kept
    assert lines[0].startswith(f"skipped {folder / 'broken.bvh'}: ") and len(lines) == 3, lines
    assert lines[1:] == ["short: part: 26 frames, fewer than the run's 32-frame window: scored on its 6 "
                         "predicted frames, not at 320 ms, 400 ms",
                         "short: tiny: 15 frames, fewer than the run's 32-frame window, no more than the 20 "
                         "it observes: nothing to forecast, not scored"]
    results = runs.evaluate(run, info, "test", trained.references(run.config, workdir, log=lines.append))
    results = results["test"]["clean"]
    assert {"model", "simlpe", "zero_velocity", "truth"} <= set(results) and len(lines) == 3
    counts = {k: v for k, v in results["model"].items() if k.startswith("clips")}
    assert counts == {"clips_80ms": 3, "clips_160ms": 3, "clips_320ms": 2, "clips_400ms": 2, "clips": 3}
    table = evaluators.forecast_table({"test": {"clean": results}})
    assert table[1].split() == ["test", "(clips", "averaged)", "3", "3", "2", "2", "3"], table
    assert [line.split()[1] for line in table[2:4]] == ["model", "simlpe"]
    # Asked to, the copy goes, named with what it copies.
    lines.clear()
    deduped = runs.corpus_for(run, folder, "test", tmp_path / "cache", log=lines.append,
                              dedup=True)
    assert sorted(deduped.names) == ["a/getup", "b/getup", "part", "tiny"]  # listed; one in no split
    assert len({c for c, _, _ in deduped.splits["test"]}) == 3
    assert any(line.startswith("skipped b/getup: exact duplicate") for line in lines), lines
