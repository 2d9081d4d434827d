"""The time-to-target harness (benchmarks/time_to_target.py) on the tiny ``runlocal`` config: it
stops at the first evaluation at or below the target, and reports a miss (never drops it) when the
budget ends first."""
import json
import math
from pathlib import Path

import orbax.checkpoint as ocp
import pytest

from benchmarks import time_to_target as ttt
from runs import runlocal_config


def _config(data_dir, steps=6, eval_every=2):
    config = runlocal_config(data_dir)
    config.train.update(steps=steps, eval_every=eval_every, log_every=1)
    return config


@pytest.fixture(scope="module")
def data_dir(deepmimic_dir):
    return deepmimic_dir


def _checkpoint_steps(workdir):
    with ocp.CheckpointManager(Path(workdir).absolute() / "checkpoints") as mngr:
        return sorted(mngr.all_steps())


@pytest.mark.e2e  # two in-process trainer runs, ~30 CPU s; make test: the harness's bookkeeping below
def test_stops_at_the_first_evaluation_at_or_below_target(tmp_path, data_dir):
    run = ttt.run_to_target(_config(data_dir), tmp_path / "run", target=1e4)  # any model beats 100 m
    assert run["reached"] and run["status"] == "stopped by on_eval"
    assert run["step"] == 2 and [p["step"] for p in run["curve"]] == [2]
    assert run["frames"] == 2 * 8 * 32  # steps x batch x window
    assert _checkpoint_steps(tmp_path / "run")[-1] == 2  # training really ended there, not at step 6
    assert min(run[k] for k in ttt.SPLIT_KEYS) >= 0 and run["compile_s"] > 0
    assert math.isclose(sum(run[k] for k in ttt.SPLIT_KEYS), run["wall_s"], rel_tol=1e-9)  # parts of a whole
    assert set(run["final"]) == {"validation/mpjpe", "test/mpjpe"}  # the stopped model, test once
    assert math.isclose(run["final"]["validation/mpjpe"], run["value"], rel_tol=1e-4)


@pytest.mark.e2e
def test_a_missed_target_is_reported_as_a_miss(tmp_path, data_dir):
    # The same 6-step schedule as above (one compiled step for both; the schedule's length is in the program).
    miss = ttt.run_to_target(_config(data_dir), tmp_path / "miss", target=1e-6)  # 10 nm: impossible
    assert not miss["reached"] and miss["status"] == "done"
    assert miss["step"] == 6 and [p["step"] for p in miss["curve"]] == [2, 4, 6]  # every K, to the end
    hit = dict(miss, reached=True, wall_s=1.0, step=2, frames=512)
    s = ttt.summarize([miss, hit, miss])
    assert s["runs"] == 3 and s["reached"] == 1
    assert s["wall_s"] == math.inf and s["wall_s_range"] == [1.0, 1.0]  # counted, as infinitely slow
    assert ttt.summarize([miss, hit, hit])["step"] == 2  # a majority reached: the median is finite


def test_side_by_side_alternates_seed_by_seed_and_keeps_misses(tmp_path, monkeypatch):
    configs = ttt.variants(_config(tmp_path), ["optimized", "uniform", "batch2x"])
    assert configs["uniform"].data.dynamics_sampling == 0 and configs["optimized"].data.dynamics_sampling > 0
    assert configs["batch2x"].data.batch_size == 16 and configs["batch2x"].train.eval_every == 1
    base, sf2 = ttt.variants(_config(tmp_path), ["optimized", "schedule_free_lr2x"]).values()
    assert sf2.train.optimizer == "schedule_free" and base.train.optimizer != "schedule_free"
    assert sf2.train.learning_rate == 2 * base.train.learning_rate
    order = []

    def fake_run(config, workdir, target, **_):  # uniform misses at seed 1; others reach at 0.1 s/step
        name = Path(workdir).parent.name
        order.append((name, config.seed))
        miss = (name, config.seed) == ("uniform", 1)
        step = 4 if miss else 2 + config.seed
        curve = [{"step": s, "wall_s": 0.1 * s, "value": (50.0 if miss else 10.0) / s}
                 for s in range(1, step + 1)]
        return {"reached": not miss, "step": step, "frames": 256 * step, "wall_s": 0.1 * step,
                "value": curve[-1]["value"],
                "curve": curve, "final": {"test/mpjpe": 3.0 + config.seed}, "seed": config.seed,
                **dict.fromkeys(ttt.SPLIT_KEYS, 0.02 * step)}

    monkeypatch.setattr(ttt, "run_to_target", fake_run)
    result = ttt.compare(configs, 5.0, [0, 1], tmp_path, log=lambda _: None)
    assert order == [(n, s) for s in (0, 1) for n in ("optimized", "uniform", "batch2x")]
    assert result["summary"]["uniform"]["reached"] == 1 and len(result["runs"]["uniform"]) == 2
    assert result["summary"]["uniform"]["wall_s"] == math.inf and result["ratios"]["uniform"]["time"] is None
    assert result["summary"]["optimized"]["step"] == 2.5 and result["ratios"]["batch2x"]["steps"] == 1.0
    assert result["summary"]["optimized"]["final"]["test/mpjpe"] == {"mean": 3.5, "range": [3.0, 4.0]}
    strict = json.loads(json.dumps(ttt.jsonable(result), allow_nan=False))  # a miss median: null
    assert strict["summary"]["uniform"]["wall_s"] is None
    table = ttt.markdown(result)
    assert "| optimized | 2/2 |" in table and "| uniform | 1/2 | miss" in table
    ttt.plot(result, tmp_path / "ttt.png")
    assert (tmp_path / "ttt.png").stat().st_size > 1000


def test_resume_reuses_recorded_runs_and_runs_only_the_missing(tmp_path, monkeypatch):
    configs = ttt.variants(_config(tmp_path), ["optimized", "uniform"])
    order = []

    def fake_run(config, workdir, target, **_):
        order.append((Path(workdir).parent.name, config.seed))
        return {"reached": True, "step": 2, "frames": 512, "wall_s": 1.0 + config.seed, "value": 1.0,
                "curve": [{"step": 2, "wall_s": 1.0, "value": 1.0}], "final": {"test/mpjpe": 3.0},
                "seed": config.seed, **dict.fromkeys(ttt.SPLIT_KEYS, 0.2)}

    monkeypatch.setattr(ttt, "run_to_target", fake_run)
    recorded = {"optimized": [dict(fake_run(configs["optimized"], tmp_path / "optimized" / "s", 1), seed=s,
                                   wall_s=10.0) for s in (0, 1)],
                "uniform": [dict(fake_run(configs["uniform"], tmp_path / "uniform" / "s", 1), seed=0,
                                 wall_s=10.0)]}
    order.clear()
    report = ttt.compare(configs, 5.0, [0, 1], tmp_path, log=lambda _: None, done=recorded,
                         run_missing=False)
    assert order == [] and len(report["runs"]["uniform"]) == 1  # nothing run; the missing pair left out
    result = ttt.compare(configs, 5.0, [0, 1], tmp_path, log=lambda _: None, done=recorded)
    assert order == [("uniform", 1)]  # only the pair not recorded
    assert [r["wall_s"] for r in result["runs"]["optimized"]] == [10.0, 10.0]  # the recorded runs, reused
    assert [r["seed"] for r in result["runs"]["uniform"]] == [0, 1]
