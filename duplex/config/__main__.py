"""``python -m duplex.config --doc-table``: print the docs' table of config keys;
``--write-doc [FILE]``: regenerate it in docs/operations.md (or FILE) in place."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from . import DECLARED, doc_table, with_table


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m duplex.config", description=__doc__)
    action = parser.add_mutually_exclusive_group(required=True)
    action.add_argument("--doc-table", action="store_true", help="print the table")
    action.add_argument(
        "--write-doc", nargs="?", const="docs/operations.md", metavar="FILE",
        help="rewrite the table between its markers in FILE (default docs/operations.md)",
    )  # fmt: skip
    args = parser.parse_args(argv)
    if args.doc_table:
        sys.stdout.write(doc_table(DECLARED))
        return 0
    path = Path(args.write_doc)
    path.write_text(with_table(path.read_text(encoding="utf-8"), DECLARED), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
