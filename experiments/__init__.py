"""The experiments that ship with motionjax: ``experiments/NAME.py`` defines ``get_config(arg=None)``
(an ml_collections ConfigDict, a few overrides of :mod:`motionjax.configs.base`).

``motionjax train --config experiments/NAME.py[:ARG]`` (or ``--config NAME[:ARG]`` from anywhere) loads
one by path (:mod:`motionjax.configs`); the wheel installs this folder as ``motionjax/experiments/``.
Experiment files import what they share from the package (``from motionjax.configs import base``),
never from this folder, so they work from a wheel, a checkout or a copy of their own.
"""
