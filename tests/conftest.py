"""Shared fixtures."""

import pytest


@pytest.fixture(scope="module")
def one_thread():
    """Tiny tensors gain nothing from a second thread and lose a lot when the other core is busy."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
