from tests.lmsp.conftest import _drop_test_schemas, store_name  # noqa: F401 - the fixtures
