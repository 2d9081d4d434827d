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
