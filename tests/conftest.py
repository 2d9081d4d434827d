"""Test-session setup: 8 virtual CPU devices (set before jax is imported) for mesh tests."""
import os

_FLAG = "--xla_force_host_platform_device_count=8"
os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {_FLAG}".strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")
