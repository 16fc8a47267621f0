"""docs/ops.md is generated from the registry; it must not drift from the code."""
from pathlib import Path

from hwinfer.catalogue import markdown


def test_ops_catalogue_is_up_to_date():
    path = Path(__file__).resolve().parents[1] / "docs" / "ops.md"
    assert path.read_text() == markdown(), "regenerate with: hwinfer ops --markdown > docs/ops.md"
