"""Which packages the wheel holds (the rest of the metadata: setup.cfg).

Only ``motionjax`` goes to the top of site-packages. The repository's top-level ``experiments/``
folder ships inside it as ``motionjax/experiments/`` (``motionjax train --config NAME`` finds it there,
:mod:`motionjax.configs`); ``benchmarks/`` and ``tests/`` stay in the checkout.
"""
from setuptools import find_packages, setup

setup(packages=[*find_packages(include=["motionjax", "motionjax.*"]), "motionjax.experiments"],
      package_dir={"motionjax.experiments": "experiments"})
