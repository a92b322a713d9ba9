import pytest


@pytest.fixture(autouse=True)
def _tiny_models_on_one_thread(one_thread):
    yield
