"""After training (issue #33): a run evaluated on other corpora (motionjax evaluate), its held-out
video, apply.py on a folder, one run directory per config and the refusal to resume another's."""
import dataclasses
import json
import subprocess
import sys

import av
import numpy as np
import pytest

from motionjax import configs, train
from motionjax.core.skeleton import smpl_like
from motionjax.data import prepare, synthetic
from motionjax.efficiency import trained
from motionjax.evaluation import inference, runs
from motionjax.formats import deepmimic_clip_paths
from runs import runlocal_config


@pytest.fixture(scope="module")
def run_dir(deepmimic_dir, tmp_path_factory):
    """A tiny DeepMimic denoiser trained here, with a 2-second held-out video."""
    config = runlocal_config(deepmimic_dir)
    config.evals.clip.video_s = 2.0
    workdir = tmp_path_factory.mktemp("run") / "denoiser"
    summary = train.run_experiment(config, workdir)
    return workdir, summary


def _close(a: dict, b: dict, keys=("mpjpe", "pa_mpjpe", "accel")):
    for k in keys:
        np.testing.assert_allclose(a[k], b[k], rtol=1e-4, atol=1e-5, err_msg=k)


@pytest.mark.e2e  # the run_dir fixture: a trainer run in this process (~30 CPU s)
def test_the_trainer_writes_the_heldout_clip_as_a_video(run_dir):
    workdir, _ = run_dir
    info = trained.load(workdir).info
    _, begin, end = info.splits["test"][0]
    with av.open(str(workdir / "heldout_clip.mp4")) as video:
        frames = sum(1 for _ in video.decode(video=0))
    assert frames == min(end - begin, 60)                      # video_s = 2 s at 30 fps


@pytest.mark.e2e  # the run_dir fixture: a trainer run in this process (~30 CPU s)
def test_evaluate_gives_back_the_runs_own_numbers_from_its_data_and_from_its_files(run_dir, tmp_path):
    workdir, summary = run_dir
    run = trained.load(workdir, summary["evaluated_step"])       # the state the final evaluation scored
    reported = summary["results"]["test"]
    own = runs.evaluate(run, run.info, "test")["test"]
    for condition in ("clean", "noisy"):
        for method in ("model", "input", "pca"):
            _close(own[condition][method], reported[condition][method])
    # The three test clips' files, prepared anew in their own corpus: the same clean-input numbers.
    names = {run.info.names[c] for c, _, _ in run.info.splits["test"]}
    folder = tmp_path / "files"
    folder.mkdir()
    for p in deepmimic_clip_paths():
        if p.stem in names:
            (folder / p.name).write_bytes(p.read_bytes())
    info = runs.corpus_for(run, folder, "test", tmp_path / "cache")
    assert sorted(info.names) == sorted(names)
    again = runs.evaluate(run, info, "test")["test"]["clean"]
    _close(again["model"], reported["clean"]["model"])
    _close(again["pca"], reported["clean"]["pca"])


def _synthetic_corpus(path, skeleton=None, clips=4):
    """Procedural clips, every other one on 10% longer bones (another performer), all in ``test``."""
    motions = list(synthetic.synthetic_motions(clips, frames=120, seed=7, skeleton=skeleton))
    longer = lambda m: dataclasses.replace(m, skeleton=m.skeleton.replace(offsets=m.skeleton.offsets * 1.1))
    motions = [m if i % 2 else longer(m) for i, m in enumerate(motions)]
    return prepare.write_dataset(motions, path, window=32, splits=(("test", "rest"),), progress=False)


@pytest.mark.e2e  # the run_dir fixture: a trainer run in this process (~30 CPU s)
def test_a_second_synthetic_corpus_is_scored_with_the_runs_statistics(run_dir, tmp_path):
    workdir, summary = run_dir
    run = trained.load(workdir)
    corpus = _synthetic_corpus(tmp_path / "synthetic")
    info = runs.corpus_for(run, corpus.data_dir, "test")
    result = runs.evaluate(run, info, "test")["test"]
    assert set(result) == {"clean", "noisy"} and set(result["clean"]) == {"model", "input", "pca"}
    assert result["clean"]["input"]["mpjpe"] == 0 < result["noisy"]["input"]["mpjpe"]
    assert 0 < result["clean"]["model"]["mpjpe"] < 100
    # Standardized by the run's statistics, not the corpus's own (a different model input).
    assert not np.allclose(corpus.mean, run.info.mean)
    with pytest.raises(ValueError, match="no split 'validation'"):
        runs.corpus_for(run, corpus.data_dir, "validation")
    other = _synthetic_corpus(tmp_path / "other_skeleton", skeleton=smpl_like(), clips=1)
    with pytest.raises(inference.SkeletonMismatchError, match=f"^{other.data_dir}: skeleton differs"):
        runs.corpus_for(run, other.data_dir, "test")


@pytest.mark.e2e
@pytest.mark.slow  # two script subprocesses
def test_evaluate_and_apply_scripts(run_dir, tmp_path, env):
    workdir, _ = run_dir
    corpus = _synthetic_corpus(tmp_path / "synthetic")
    out = tmp_path / "eval.json"
    proc = subprocess.run([sys.executable, "-m", "motionjax", "evaluate", f"--workdir={workdir}",
                           f"--data={corpus.data_dir}", f"--out={out}"], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    assert "test              clean  model" in proc.stdout and "pca" in proc.stdout
    assert json.loads(out.read_text())["results"]["test"]["clean"]["model"]["mpjpe"] > 0
    # apply.py on a folder with a broken file: the others are written, the broken one named, exit 1.
    folder = tmp_path / "captures"
    folder.mkdir()
    clip = next(p for p in deepmimic_clip_paths() if "walk" in p.name)
    (folder / clip.name).write_bytes(clip.read_bytes())
    (folder / "broken.bvh").write_text("HIERARCHY\n")
    proc = subprocess.run([sys.executable, "-m", "motionjax", "apply", f"--workdir={workdir}",
                           str(folder), f"--out={tmp_path / 'out'}"], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 1 and f"{folder / 'broken.bvh'}:" in proc.stderr, proc.stderr
    assert (tmp_path / "out" / f"{clip.stem}.bvh").exists() and "1 of 2 files written" in proc.stdout


def test_the_run_directory_is_named_after_the_config():
    assert configs.run_name("experiments/autoencoder.py:bandai,8") == "autoencoder_bandai_8"
    assert configs.run_name("experiments/deepmimic_denoise.py") == "deepmimic_denoise"
    assert configs.run_name("/abs/path/to/x.py:runlocal") == "x_runlocal"


@pytest.mark.e2e  # the run_dir fixture: a trainer run in this process (~30 CPU s)
def test_a_run_directory_refuses_another_configs_run_and_resumes_its_own(run_dir, deepmimic_dir):
    workdir, _ = run_dir
    own = runlocal_config(deepmimic_dir)
    own.evals.clip.video_s = 2.0
    own.train.steps = 50                                          # run longer: the same experiment
    train.check_resume(own, workdir)
    other = configs.load("experiments/autoencoder.py:deepmimic,runlocal")
    other.data.dir = str(deepmimic_dir)
    with pytest.raises(train.ResumeError, match=f"^{workdir} holds a run of another config "
                       r"\(data\.chunk: 8 there, 16 here; .*; and \d+ more\): resume it with its own config"):
        train.check_resume(other, workdir)
