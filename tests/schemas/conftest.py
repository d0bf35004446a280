import pytest

from undertow.schemas import Record
from tests.record_examples import make_examples


@pytest.fixture
def examples() -> dict[str, Record]:
    return make_examples()
