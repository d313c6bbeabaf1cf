import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
# The measured GPU data lives beside the checkout; CI has it, a fresh clone may not.
DATA = Path(os.environ.get("PREDICTOR_DATA", REPO.parent / "shared" / "data" / "neusight"))


@pytest.fixture(scope="session")
def data_dir() -> Path:
    if not DATA.is_dir():
        pytest.skip(f"measured GPU data not found at {DATA} (set PREDICTOR_DATA)")
    return DATA


@pytest.fixture(scope="session")
def resnet50_graph():
    import predictor

    return predictor.trace("resnet50", batch_size=64)
