"""benchmarks/ablations.py's arithmetic: steps to a target between evaluations, and the seed table."""
import importlib.util
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "ablations.py"
spec = importlib.util.spec_from_file_location("ablations", SCRIPT)
ablations = importlib.util.module_from_spec(spec)
spec.loader.exec_module(ablations)


def test_steps_to_interpolates_between_evaluations():
    curve = [(50, 4.0), (100, 3.0), (150, 2.0), (200, 2.5)]
    assert ablations.steps_to(curve, 2.5) == pytest.approx(125.0)  # 3.0 -> 2.0 over 100..150
    assert ablations.steps_to(curve, 3.0) == 100.0                  # reached exactly at an evaluation
    assert ablations.steps_to(curve, 5.0) == 50.0                   # already at the first evaluation
    assert ablations.steps_to(curve, 1.0) is None                   # never


def test_table_gives_the_mean_and_range_over_seeds_and_the_change_against_base():
    rows = {"base": {"overrides": [], "runs": [{"validation/mpjpe": 1.0, "steps_to_target": 100.0},
                                                {"validation/mpjpe": 3.0, "steps_to_target": 300.0}]},
            "x": {"overrides": ["a=1"], "runs": [{"validation/mpjpe": 3.0, "steps_to_target": None}]}}
    head, _, base, x = ablations.table(rows, ["validation/mpjpe", "ood_validation/mpjpe"], 2.3)
    assert "ood_validation" not in head  # no run has it
    assert "| 2.000 [1.000–3.000] | 200 [100–300] | - |" in base
    assert "| 3.000 | - (1 not reached) | +50.0% |" in x


def test_tradeoff_plot_skips_an_ablation_without_both_metrics(tmp_path):
    rows = {"base": {"overrides": [], "runs": [{"validation/mpjpe": 1.0, "ood_validation/mpjpe": 1.7}]},
            "x": {"overrides": ["a=1"], "runs": [{"validation/mpjpe": 1.2}]}}
    ablations.tradeoff_plot(rows, "validation/mpjpe", "ood_validation/mpjpe", tmp_path / "t.png")
    assert (tmp_path / "t.png").read_bytes()[:4] == b"\x89PNG"
