"""The user commands, one module each (``motionjax COMMAND``, :mod:`motionjax.cli`): ``main(argv)``
runs the command with its flags ``argv`` (default ``sys.argv[1:]``) and returns its exit status, or
raises ``SystemExit`` with it (argparse and absl exit that way).

One command per process: the absl ones define their flags when imported (two would clash), and
importing ``train`` sets the allocator up first, which may re-execute the process
(:mod:`motionjax.malloc`). Commands import the library lazily where they can, so ``--help`` answers at once.
"""
from __future__ import annotations

import sys


def run_absl(run, argv: list[str] | None, **kwargs) -> int:
    """absl's ``app.run(run)`` on the flags ``argv`` (default ``sys.argv[1:]``); the program name is
    ``sys.argv[0]`` (``motionjax COMMAND`` when :mod:`motionjax.cli` started it)."""
    from absl import app, flags

    argv = sys.argv[1:] if argv is None else list(argv)
    # absl's --help prints __main__'s docstring and the flags of the module named sys.argv[0] (it expects
    # the command to be the script run): show this command's.
    command = sys.modules[run.__module__]
    sys.modules["__main__"].__doc__ = command.__doc__
    for flag in flags.FLAGS.get_key_flags_for_module(command.__name__):
        flags.FLAGS.register_key_flag_for_module(sys.argv[0], flag)
    app.run(run, argv=[sys.argv[0], *argv], **kwargs)  # exits (SystemExit) with run's status
    return 0
