"""A model over motion files of any length (motionjax.evaluation.inference, scripts/apply.py): the round trip
through windows, features and the file's own conventions, skeleton checks, bad files."""
import dataclasses

import numpy as np
import pytest

from motionjax.configs import base
from motionjax.core import features, windows
from motionjax.core import rotations as rot
from motionjax.core.skeleton import Skeleton
from motionjax.data import corpus
from motionjax.data.info import load_info
from motionjax.evaluation import inference
from motionjax.formats import Motion, deepmimic_clip_paths, load, read_bvh, write_bvh


@pytest.fixture(scope="module")
def spec(deepmimic_dir):
    config = base.get_config()
    config.data.dir = str(deepmimic_dir)
    return inference.ModelSpec.from_run(config, load_info(deepmimic_dir))


def _long_clip() -> Motion:
    """getup_faceup at 30 fps: 114 frames, five overlapping 32-frame windows."""
    m = load(next(p for p in deepmimic_clip_paths() if "getup_faceup" in p.name))
    return Motion(m.skeleton, 30.0, m.root_position[::2], m.rotations[::2], name="getup")


def _bvh_like_a_capture(m: Motion, path):
    """``m`` as a capture exporter writes it: centimetres, a placeholder root above the body whose
    child carries the translation in position channels, YXZ Euler angles."""
    sk, t = m.skeleton, m.num_frames
    skeleton = Skeleton(["world", *sk.names], [-1, 0, *[p + 1 for p in sk.parents[1:]]],
                        np.concatenate([np.zeros((1, 3)), sk.offsets]), ["ball", *sk.kinds],
                        np.concatenate([np.zeros((1, 3)), sk.axes]), None)
    offsets = np.broadcast_to(skeleton.offsets, (t, sk.num_joints + 1, 3)).copy()
    offsets[:, 1] = m.root_position
    raw = Motion(skeleton, m.fps, np.zeros((t, 3)), np.concatenate(
        [rot.identity_quat((t, 1), np.float64, np), m.rotations], axis=1), offsets=offsets, name=m.name)
    write_bvh(path, raw, order="YXZ", scale=0.01)
    return raw


def _identity(x):
    return x


def test_identity_model_gives_back_the_file_with_its_hierarchy_channels_and_rate(spec, tmp_path):
    source = tmp_path / "capture.bvh"
    _bvh_like_a_capture(_long_clip(), source)
    assert inference.window_count(114, spec, spec.window // 4) == 5
    written, errors = inference.apply_files(_identity, spec, [source], tmp_path / "out")
    assert errors == [] and written == [tmp_path / "out" / "capture.bvh"]
    text_in, text_out = source.read_text().splitlines(), written[0].read_text().splitlines()
    cut = text_in.index("MOTION")
    assert text_out[:cut + 3] == text_in[:cut + 3]           # hierarchy, Frames, Frame Time verbatim
    a, b = read_bvh(source, scale=0.01), read_bvh(written[0], scale=0.01)
    assert b.num_frames == a.num_frames == 114
    # Through canonicalization, float32 features, five overlapping windows and back: < 0.1 mm.
    np.testing.assert_allclose(b.positions(), a.positions(), atol=1e-4)


def test_skeleton_mismatch_and_broken_files_name_the_file_and_the_others_still_run(spec, tmp_path):
    clip = _long_clip()
    good, broken, other = tmp_path / "good.bvh", tmp_path / "broken.bvh", tmp_path / "other.bvh"
    _bvh_like_a_capture(clip, good)
    broken.write_text(good.read_text()[:-2000])                # a truncated frame table
    sk = clip.skeleton
    renamed = sk.replace(names=[n.replace("left_knee", "left_shin") for n in sk.names])
    write_bvh(other, dataclasses.replace(clip, skeleton=renamed))
    lines = []
    written, errors = inference.apply_files(_identity, spec, [broken, other, good], tmp_path / "out",
                                            log=lines.append)
    assert written == [tmp_path / "out" / "good.bvh"]
    assert len(errors) == 2 and lines == [f"error: {e}" for e in errors]
    assert errors[0].startswith(f"{broken}:193: frame 108 has 37 values")   # file:line: what is wrong
    assert errors[1].startswith(f"{other}:") and "['left_shin'] only in the clip" in errors[1]


def test_unconform_inverts_conform_on_a_capture_file(tmp_path):
    raw = _bvh_like_a_capture(_long_clip(), tmp_path / "capture.bvh")
    original = read_bvh(tmp_path / "capture.bvh")                  # in the file's centimetres
    conformed, decided = corpus.conform(original)
    assert decided["units"] == "cm" and conformed.skeleton.num_joints == raw.skeleton.num_joints - 1
    back = corpus.unconform(conformed, original, decided["units"])
    np.testing.assert_allclose(back.positions(), original.positions(), atol=1e-9)
    np.testing.assert_allclose(back.offsets, original.offsets, atol=1e-9)


def test_a_bandai_capture_comes_back_through_an_identity_model(tmp_path):
    from test_corpus import _bandai_or_skip

    source = _bandai_or_skip() / "data" / "dataset-1_dash_normal_001.bvh"  # its joint_Root moves
    skeleton = corpus.conform(read_bvh(source))[0].skeleton
    f = features.feature_dim(skeleton)
    spec = inference.ModelSpec(skeleton, np.zeros(f, np.float32), np.ones(f, np.float32), fps=30.0, window=64,
                               chunk=16)
    written, errors = inference.apply_files(_identity, spec, [source], tmp_path)
    assert errors == []
    text_in, text_out = source.read_text().splitlines(), written[0].read_text().splitlines()
    cut = text_in.index("MOTION")
    assert text_out[:cut] == text_in[:cut]                      # joint_Root, 6 channels per joint, ZXY
    a, b = read_bvh(source, scale=0.01), read_bvh(written[0], scale=0.01)
    np.testing.assert_allclose(b.positions(), a.positions(), atol=1e-4)


def test_a_foreign_corpus_is_prepared_once_in_the_runs_joint_order(spec, tmp_path):
    from motionjax.configs import base
    from motionjax.data import prepare

    good, broken = tmp_path / "good.bvh", tmp_path / "broken.bvh"
    _bvh_like_a_capture(_long_clip(), good)                     # depth-first joint order, cm, a placeholder
    broken.write_text("HIERARCHY\nROOT hips\n{\n")
    lines = []
    settings = prepare.Settings.from_config(base.get_config().data)
    info = inference.prepare_corpus([good, broken], spec, settings, tmp_path / "cache", log=lines.append)
    assert info.names == ("good",) and info.skeleton.names == spec.skeleton.names
    assert list(info.splits) == ["test"] and info.fps == spec.fps and info.window == spec.window
    assert len(lines) == 1 and lines[0].startswith(f"skipped {broken}: ")
    again = inference.prepare_corpus([good, broken], spec, settings, tmp_path / "cache", log=lines.append)
    assert again.data_dir == info.data_dir and lines == [lines[0]] * 2  # prepared once, named each time


def _biased(x):
    """A window model whose windows disagree: each window's root moves by an amount set by its own
    content (constant inside a window, different from the next window's)."""
    shift = np.zeros_like(x)
    shift[..., :3] = 3 * np.tanh(x.mean(axis=(1, 2, 3), keepdims=True) * 50)  # [B, 1, 1, 3]: the root
    return x + shift


def test_a_long_clip_is_each_windows_output_where_one_window_reaches_and_has_no_step_at_borders(spec):
    clip = inference.model_view(_long_clip(), spec)[0]
    t, overlap = spec.window, spec.window // 4
    out = inference.apply_motion(_biased, spec, clip, overlap=overlap)
    starts = windows.window_starts(clip.num_frames, t, overlap)
    # Each window alone (a clip of exactly one window: no blending) is the per-window output.
    alone = [inference.apply_motion(_biased, spec, dataclasses.replace(
        clip, root_position=clip.root_position[s:s + t], rotations=clip.rotations[s:s + t])).positions()
        for s in starts]
    pos = out.positions()
    owners = [[k for k, s in enumerate(starts) if s <= f < s + t] for f in range(clip.num_frames)]
    single = [f for f in range(clip.num_frames) if len(owners[f]) == 1]
    assert len(single) > clip.num_frames / 3
    for f in single:
        k = owners[f][0]
        np.testing.assert_allclose(pos[f], alone[k][f - starts[k]], atol=1e-5)
    # No step at the borders: frame to frame the output moves no more than the windows' own outputs do,
    # plus a fraction of their disagreement; cutting from one window to the next jumps by all of it.
    step = lambda p: np.linalg.norm(np.diff(p, axis=0), axis=-1).max()
    own = max(step(a) for a in alone)
    shared = starts[:-1] + t - starts[1:]
    gap = lambda k: alone[k][starts[k + 1] - starts[k]:] - alone[k + 1][:shared[k]]  # on their shared frames
    disagree = max(np.linalg.norm(gap(k), axis=-1).max() for k in range(len(starts) - 1))
    cut = np.concatenate([alone[k][:starts[k + 1] - starts[k]] for k in range(len(starts) - 1)] + [alone[-1]])
    assert disagree > 3 * own                                   # the windows really disagree
    assert step(pos) <= own + np.pi / 2 * disagree / (shared.min() + 1)
    assert step(cut) > 2 * step(pos)
