"""docs/your_data.md end to end: a folder of BVH files -> a trained autoencoder, evaluated on every
file, applied and rendered, through the ``motionjax`` command as a user runs it (the ``runlocal`` size
of the ``folder`` variant, on the one CPU device a user's host gives it: ``user_env``). The forecaster's
folder variant trains in-process in tests/test_predict.py (test_someone_elses_bvh_folder_...): a fifth
subprocess here cost ~2 minutes of the suite."""
import subprocess
import sys

import av
import pytest

from motionjax.core.skeleton import smpl_like
from motionjax.data import synthetic
from motionjax.formats import read_bvh, write_bvh
from runs import REPO


@pytest.mark.slow  # four motionjax subprocesses
# e2e: ~60 CPU s. make test: each step on its own (test_corpus, test_faults' trainer runs, test_render).
@pytest.mark.e2e
def test_a_bvh_folder_becomes_a_trained_evaluated_and_rendered_autoencoder(tmp_path, user_env):
    folder = tmp_path / "my_bvh"
    folder.mkdir()
    for m in synthetic.synthetic_motions(12, frames=100, seed=3, skeleton=smpl_like()):  # 3.3 s each
        write_bvh(folder / f"{m.name[-2:]}.bvh", m, scale=0.01)  # centimetres, as capture exporters write

    def motionjax(*args):
        proc = subprocess.run([sys.executable, "-m", "motionjax", *map(str, args)], cwd=tmp_path,
                              env=user_env, capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
        return proc.stdout

    out = motionjax("train", "--config", f"{REPO}/experiments/autoencoder.py:folder,runlocal",
                    "--config.data.source=my_bvh")
    assert "data: preparing my_bvh into data_cache/folder_w64_clean" in out
    prepared = "data: data_cache/folder_w64_clean: 12 clips, 0.01 h (test 1, train 10, validation 1); 0 not"
    assert prepared in out
    assert "test              clean  model" in out
    assert (tmp_path / "runs/autoencoder_folder_runlocal").is_dir()

    run = "runs/autoencoder_folder_runlocal"
    out = motionjax("evaluate", "--workdir", run, "--data", "my_bvh")  # every file, into one split
    assert "(test: 12 clips, 12 segments, 1200 frames; files left out: 0)" in out, out
    assert "test              clean  model" in out

    motionjax("apply", "--workdir", run, "my_bvh/00.bvh", "--out", "out")
    source, output = read_bvh(folder / "00.bvh"), read_bvh(tmp_path / "out/00.bvh")
    assert output.num_frames == source.num_frames and output.skeleton.names == source.skeleton.names
    assert "v.mp4: 100 frames" in motionjax("render", "my_bvh/00.bvh", "out/00.bvh", "--out", "v.mp4")
    with av.open(str(tmp_path / "v.mp4")) as video:
        assert video.streams.video[0].width == 480  # two panels: the input and the model's output


@pytest.mark.parametrize("module, window", [("autoencoder", 64), ("predict", 90)])
def test_the_folder_variants_are_valid_configs_for_any_folder(module, window):
    """``:folder`` takes its corpus from ``--config.data.source`` and prepares it apart by window; the
    forecaster's variant is what the end-to-end test above would train next (checked, not trained)."""
    import importlib

    from motionjax import train
    from motionjax.train import checks

    c = importlib.import_module(f"experiments.{module}").get_config("folder,runlocal")
    with pytest.raises(checks.ConfigError, match="data.source"):
        train.check_config(c, 1)
    c.data.source = "my_bvh"
    train.check_config(c, 1)
    assert c.data.window == window and c.data.dir == f"data_cache/folder_w{window}_clean"
