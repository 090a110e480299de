"""Host CPU devices for a subprocess, set through XLA_FLAGS without losing the flags already
there (tests/conftest.py's compile flags, or `make test-kernels`' kernel flags)."""

DEVICE_COUNT_FLAG = "--xla_force_host_platform_device_count"


def with_host_devices(environment: dict, devices: int) -> dict:
    """`environment` with `devices` host CPU devices, keeping its other XLA flags."""
    flags = [flag for flag in environment.get("XLA_FLAGS", "").split()
             if not flag.startswith(DEVICE_COUNT_FLAG)]
    return {**environment, "XLA_FLAGS": " ".join([*flags, f"{DEVICE_COUNT_FLAG}={devices}"])}
