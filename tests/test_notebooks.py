"""The notebooks under notebooks/ are committed clean and run top to bottom as shipped.

Each runs in a fresh ``python3`` kernel (jupyter_client starts it with this interpreter), from the
notebooks/ directory as Jupyter would, with the environment a user has (one CPU device: the suite's
forced 8-device flag is removed), but for the session's compilation cache (conftest.py): a program
read from it is the program the kernel would have compiled (the cache key is the program, its
compile options and the jax/XLA versions), so the cache changes how long a notebook takes, not what
it computes or checks. A user's first run of a notebook compiles everything: ~60 CPU s for 05.
Notebooks assert their own checks (BVH round trip, restored checkpoint == reported metrics); a failing
cell fails the test with the cell's traceback. They write only to runs/notebooks/, data_cache/ and
temp dirs.
"""
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

NOTEBOOK_DIR = Path(__file__).resolve().parents[1] / "notebooks"
NOTEBOOKS = sorted(NOTEBOOK_DIR.glob("*.ipynb"))
CELL_TIMEOUT_S = 400  # the training cell of 03 compiles for about a minute on 2 busy cores


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


def _user_env(env: dict) -> dict:
    """The suite's environment ``env`` (conftest.py: the session's compilation cache, every program
    kept) on one CPU device, as a user's."""
    flags = " ".join(f for f in env.get("XLA_FLAGS", "").split()
                     if not f.startswith("--xla_force_host_platform_device_count"))
    return dict(env, XLA_FLAGS=flags)


@pytest.mark.slow  # a kernel subprocess per notebook
@pytest.mark.timeout(900)
@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_runs(path, env):
    nb = nbformat.read(path, as_version=4)
    client = NotebookClient(nb, timeout=CELL_TIMEOUT_S, kernel_name="python3",
                            resources={"metadata": {"path": str(NOTEBOOK_DIR)}})
    client.execute(env=_user_env(env))
    errors = [o for cell in nb.cells if cell.cell_type == "code" for o in cell.outputs
              if o.output_type == "error"]
    assert not errors
    images = sum("image/png" in o.get("data", {}) or "text/html" in o.get("data", {})
                 for cell in nb.cells if cell.cell_type == "code" for o in cell.outputs)
    assert images >= 4, f"{path.name}: expected pictures, got {images} image outputs"
