"""Print the preset ledger table of docs/ledger.md (``--write`` updates the file in place).

    python scripts/ledger_table.py            # the Markdown table, to stdout
    python scripts/ledger_table.py --write    # replace the table in docs/ledger.md
"""
from __future__ import annotations

import sys
from pathlib import Path

from hwinfer.engine.ledger import presets_markdown

DOC = Path(__file__).resolve().parents[1] / "docs" / "ledger.md"
BEGIN, END = "<!-- ledger-table: begin -->\n", "<!-- ledger-table: end -->\n"


def updated(text: str, table: str) -> str:
    """``text`` with the part between the markers replaced by ``table``."""
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    return head + BEGIN + table + END + tail


if __name__ == "__main__":
    table = presets_markdown()
    if "--write" in sys.argv[1:]:
        DOC.write_text(updated(DOC.read_text(), table))
    else:
        print(table, end="")
