from tests.lmsp.conftest import store_name  # noqa: F401 - the fixture
