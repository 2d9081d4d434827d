"""The skeleton video renderer (motionjax.evaluation.artifacts): files that play back, every frame."""
import av
import numpy as np
import pytest
from PIL import Image

from motionjax.evaluation import artifacts
from motionjax.formats import deepmimic_clip_paths, read_deepmimic


@pytest.fixture(scope="module")
def clips():
    motion = read_deepmimic(next(p for p in deepmimic_clip_paths() if "run" in p.name))
    truth = motion.positions()[:17]
    noisy = truth + np.random.default_rng(0).normal(0, 0.03, truth.shape)
    return motion.skeleton, {"input": noisy, "output": truth, "truth": truth}


def test_mp4_reads_back_with_every_frame_in_order(clips, tmp_path):
    skeleton, named = clips
    frames = list(artifacts.skeleton_frames(skeleton, named, title="run"))
    assert len(frames) == 17 and frames[0].dtype == np.uint8
    assert len({f.tobytes() for f in frames}) == 17                   # the body moves: every frame differs
    assert (frames[0] < 128).mean() > 0.002                           # something is drawn on white
    path = tmp_path / "clip.mp4"
    assert artifacts.write_video(frames, path, fps=30.0) == 17
    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        assert stream.codec_context.name == "h264"
        assert float(stream.average_rate) == pytest.approx(30, rel=1e-3)
        decoded = [f.to_ndarray(format="rgb24") for f in container.decode(stream)]
    assert len(decoded) == 17
    h, w = decoded[0].shape[:2]
    # Lossy, but each decoded frame is its own source frame, far nearer to it than to the others.
    err = np.array([[np.abs(d.astype(int) - f[:h, :w].astype(int)).mean() for f in frames] for d in decoded])
    assert np.all(np.argmin(err, axis=1) == np.arange(17))
    assert np.diag(err).max() < 3.0


def test_gif_and_render_video_write_the_frame_count(clips, tmp_path):
    skeleton, named = clips
    path = tmp_path / "clip.gif"
    assert artifacts.render_video(skeleton, {"truth": named["truth"]}, path, fps=20.0) == 17
    with Image.open(path) as gif:
        assert gif.n_frames == 17 and gif.info["duration"] == 50
    with pytest.raises(ValueError, match="expected .mp4 or .gif"):
        artifacts.write_video([np.zeros((8, 8, 3), np.uint8)], tmp_path / "clip.avi")


def test_an_input_and_its_output_of_the_same_name_get_a_panel_each(deepmimic_dir, tmp_path):
    """``render.py clip.bvh out/clip.bvh`` (an input and ``apply.py``'s output of it): two panels,
    titled by path where the stems collide."""
    from motionjax.configs import base
    from motionjax.data.info import load_info
    from motionjax.evaluation import inference
    from motionjax.formats import write_bvh

    config = base.get_config()
    spec = inference.ModelSpec.from_run(config, load_info(deepmimic_dir))
    source = tmp_path / "clip.bvh"
    write_bvh(source, read_deepmimic(next(p for p in deepmimic_clip_paths() if "run" in p.name)))
    written, errors = inference.apply_files(lambda x: x, spec, [source], tmp_path / "out")
    assert written == [tmp_path / "out" / "clip.bvh"] and not errors
    paths = [source, written[0]]
    assert artifacts.panel_names(paths) == ["clip", "out/clip"]
    assert artifacts.panel_names([source, source]) == ["clip", "clip (2)"]
    frames = {}
    for k, files in ((1, paths[:1]), (2, paths)):
        video = tmp_path / f"{k}.mp4"
        n = artifacts.render_files(files, video)
        with av.open(str(video)) as container:
            decoded = [f.to_ndarray(format="rgb24") for f in container.decode(video=0)]
        assert len(decoded) == n == 25                          # run: 25 frames at 30 fps, both files
        frames[k] = decoded[0]
    assert frames[2].shape[1] == 2 * frames[1].shape[1] == 480  # a 240-pixel panel per file
    with pytest.raises(ValueError, match="1 panel names for 2 files"):
        artifacts.render_files(paths, tmp_path / "x.mp4", names=["input"])


def test_long_titles_are_fitted_inside_the_frame(clips, monkeypatch):
    """A long path as a panel title and a long video title: no ink in the frame's outer columns (a
    title wider than its panel is clipped at the frame's edge: checked with the fitting turned off)."""
    skeleton, named = clips
    long = "/data/captures/2026/session_07/performer_b/walk_forward_then_turn_left.bvh"
    names = {long: named["input"][:1], "output": named["output"][:1]}
    title = "a held-out take of performer b from the second session, noise level 1.0"

    def edge_ink(frame):
        dark = frame.min(axis=-1) < 160
        return dark[:, :2].any() or dark[:, -2:].any()

    frame = next(artifacts.skeleton_frames(skeleton, names, title=title))
    top = frame[: frame.shape[0] // 5].min(axis=-1) < 160
    assert top[:, : frame.shape[1] // 2].any() and not edge_ink(frame)  # titles drawn, and inside
    monkeypatch.setattr(artifacts, "_fit", lambda *args, **kwargs: None)
    assert edge_ink(next(artifacts.skeleton_frames(skeleton, names, title=title)))
