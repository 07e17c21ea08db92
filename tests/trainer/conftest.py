import pytest


@pytest.fixture(scope="session")
def megatron_tp1():
    """megatron-core's process groups for one process (gloo on CPU), shared by this session's trainer tests."""
    from clawr1.trainer.megatron_setup import init_parallel

    return init_parallel(tp=1, seed=0)
