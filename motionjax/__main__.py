"""``python -m motionjax COMMAND``: the ``motionjax`` command (:mod:`motionjax.cli`)."""
import sys

from motionjax.cli import main

sys.exit(main())
