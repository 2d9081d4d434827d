"""The pure array math: skeletons, rotations, kinematics, the dynamics loss's blocked Jacobian products,
the feature layout of a motion window, time halos and sharding-exact masked means.

Plain functions over arrays (jax/numpy only): nothing here imports Flax, optax, orbax or Grain, or any
other motionjax package.
"""
