"""The notebooks under notebooks/ are committed clean and run top to bottom as shipped.

Each runs in a fresh kernel on one CPU device, as a user's, with the session's compilation cache
(``runs.run_notebook``: a cached program is the one the kernel would compile, so the cache changes a
notebook's time, not what it checks; a user's first run compiles everything). 05 runs in
tests/test_generate.py on the run its fixture trains (the notebook's own toy run is that fixture's
config): training it again here cost ~50 CPU s of the suite.
Notebooks assert their own checks (BVH round trip, restored checkpoint == reported metrics); a failing
cell fails the test with the cell's traceback. They write only to runs/notebooks/, data_cache/ and
temp dirs.
"""
import nbformat
import pytest

from runs import NOTEBOOK_DIR, run_notebook

NOTEBOOKS = sorted(NOTEBOOK_DIR.glob("*.ipynb"))
CELL_TIMEOUT_S = 400  # the training cell of 03 compiles for about a minute on 2 busy cores
# Notebooks run by another file, on a run that file's fixture trains anyway.
RUN_ELSEWHERE = {"05_generate": "tests/test_generate.py::test_the_generation_notebook_runs_on_this_run"}


def test_notebooks_exist():
    assert [p.stem[:2] for p in NOTEBOOKS] == ["01", "02", "03", "04", "05"], NOTEBOOKS


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_committed_clean(path):
    nb = nbformat.read(path, as_version=4)
    nbformat.validate(nb)
    dirty = [i for i, cell in enumerate(nb.cells)
             if cell.cell_type == "code" and (cell.outputs or cell.execution_count is not None)]
    assert not dirty, (f"{path.name}: cells {dirty} carry outputs; clear them before committing "
                       f"(JupyterLab: Edit > Clear Outputs of All Cells)")


# make test runs 01 (the kernel, the session's cache, the data and skeleton cells); the others, 35-40 CPU s
# each, run in make test-all: the library calls they make are tested on their own (jacobian, dynamics, train,
# predict).
QUICK = {"01_data_and_skeleton"}


@pytest.mark.slow  # a kernel subprocess per notebook
@pytest.mark.timeout(900)
@pytest.mark.parametrize("path", [pytest.param(p, marks=() if p.stem in QUICK else pytest.mark.e2e)
                                  for p in NOTEBOOKS if p.stem not in RUN_ELSEWHERE], ids=lambda p: p.stem)
def test_runs(path, env):
    run_notebook(path, env, timeout_s=CELL_TIMEOUT_S)
