"""The ``motionjax`` command (motionjax/cli.py): one screen of help, each subcommand a module of
motionjax.commands; ``--config`` takes a path or the name of a shipped experiment."""
import configparser
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

from motionjax import cli, configs
from runs import REPO


def test_the_help_fits_a_screen_with_an_example_for_each_command(capsys):
    assert cli.main(["--help"]) == 0
    text = capsys.readouterr().out
    lines = text.splitlines()
    assert len(lines) <= 24 and max(map(len, lines)) <= 100, text
    for name, command in cli.COMMANDS.items():
        assert f"  {name} " in text and command.example in text
        assert command.example.startswith(f"motionjax {name} ")
        # Found, not imported: a command defines absl flags at import (one command per process), and
        # train sets the allocator up (it may re-execute the process).
        assert importlib.util.find_spec(f"motionjax.commands.{name}") is not None, name
    assert set(cli.COMMANDS) == {"train", "prepare", "evaluate", "apply", "render", "export", "sample",
                                 "stylize"}
    assert cli.main([]) == 2 and "usage: motionjax COMMAND" in capsys.readouterr().out
    assert cli.main(["trian"]) == 2 and "error: unknown command 'trian'" in capsys.readouterr().err


def test_config_takes_a_path_or_the_name_of_a_shipped_experiment(tmp_path, monkeypatch):
    shipped = REPO / "experiments"
    assert configs.EXPERIMENTS == shipped and "deepmimic_denoise" in configs.names()
    assert "__init__" not in configs.names()
    assert configs.resolve("deepmimic_denoise:runlocal") == f"{shipped / 'deepmimic_denoise.py'}:runlocal"
    assert configs.resolve("autoencoder") == str(shipped / "autoencoder.py")
    # A file of that name in the working directory is the user's: it wins over the shipped one.
    monkeypatch.chdir(tmp_path)
    (tmp_path / "autoencoder.py").write_text("def get_config(arg=None):\n    return {'mine': arg}\n")
    assert configs.resolve("autoencoder.py:x") == "autoencoder.py:x"
    assert configs.load("autoencoder.py:x") == {"mine": "x"}
    assert configs.load("deepmimic_denoise:runlocal").train.steps == 6  # the shipped one, by name
    assert configs.resolve("nothing_here:x") == "nothing_here:x"  # left for the loader to name
    with pytest.raises(FileNotFoundError, match="experiment config nothing_here: no such file"):
        configs.load("nothing_here")
    with pytest.raises(ValueError, match="'nope' is not a shipped experiment; expected one of autoencoder"):
        configs.experiment("nope")
    # Experiments build on each other by name (generate on autoencoder), as they would from a wheel.
    assert "generation" in configs.load("generate:deepmimic,runlocal")


def test_setup_cfg_installs_the_command():
    cfg = configparser.ConfigParser()
    cfg.read(REPO / "setup.cfg")
    assert cfg["options.entry_points"]["console_scripts"].split() == ["motionjax", "=", "motionjax.cli:main"]


_THP = Path("/sys/kernel/mm/transparent_hugepage/enabled")


@pytest.mark.slow  # Python subprocesses
def test_python_m_motionjax_runs_the_commands_and_train_sets_the_allocator_first(tmp_path):
    run = lambda *args, **kw: subprocess.run([sys.executable, "-m", "motionjax", *args], cwd=tmp_path,
                                             capture_output=True, text=True, timeout=300, **kw)
    shown = run("render", "--help")
    assert shown.returncode == 0 and "motionjax render A.bvh [B.bvh ...] --out clip.mp4" in shown.stdout
    assert "--names: panel titles" in shown.stdout
    missing = run("evaluate", "--data", "x")
    assert missing.returncode == 1 and "Flag --workdir must have a value" in missing.stderr
    # The trainer's allocator re-executes the process once (motionjax/malloc.py): through the command
    # too, with its arguments (the config below runs in the re-executed process and says what it got).
    config = tmp_path / "probe.py"
    config.write_text("import os\n\ndef get_config():\n"
                      "    raise ValueError('tunables ' + str(os.environ.get('GLIBC_TUNABLES')))\n")
    env = {k: v for k, v in os.environ.items() if k not in ("GLIBC_TUNABLES", "MOTIONJAX_MALLOC")}
    trained = run("train", "--config", str(config), env=env)
    assert trained.returncode == 2, trained.stderr
    huge = _THP.exists() and "[never]" not in _THP.read_text()
    expected = "tunables glibc.malloc.hugetlb=1" if huge else "tunables None"
    assert trained.stderr.strip().splitlines()[-1] == f"error: --config {config}: ValueError: {expected}", \
        trained.stderr
