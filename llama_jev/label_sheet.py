"""``python -m llama_jev.label_sheet``: a labelling sheet sampled from SHADOW decision records.

    python -m llama_jev.label_sheet --records decisions.jsonl --persist-dir ./storage \\
        --out sheet.csv [--sample 100] [--seed 0] [--purpose P] [--version V]

Node text comes from a LlamaIndex storage folder (``index.storage_context.persist(dir)``); for
other stores (Qdrant, ...) call ``llama_jev.calibration.write_label_sheet`` with your index.
Fill the ``relevant`` column, then: ``python -m llama_jev.calibrate --records decisions.jsonl
--labels sheet.csv``. Exit status: 0 written, 2 unusable input.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from llama_jev.calibration.records import CalibrationInputError
from llama_jev.calibration.sheet import write_label_sheet

__all__ = ["main"]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m llama_jev.label_sheet",
        description="Sample decisions from a SHADOW log and write a sheet to label (text from your own index).",
    )
    parser.add_argument("--records", required=True, help="decision records, one JSON object per line")
    parser.add_argument("--persist-dir", required=True, help="a LlamaIndex storage folder holding the docstore")
    parser.add_argument("--out", required=True, help="the sheet to write: .csv, or JSONL for any other suffix")
    parser.add_argument("--sample", type=int, default=100, help="how many decisions to sample (default 100)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the sample (default 0)")
    parser.add_argument("--purpose", help="use only records of this purpose")
    parser.add_argument("--version", help="use only records of this version")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI with ``argv`` (default: ``sys.argv[1:]``) and return the exit status."""
    args = _parser().parse_args(argv)
    from llama_index.core import StorageContext

    try:
        docstore = StorageContext.from_defaults(persist_dir=args.persist_dir).docstore
    except (OSError, ValueError) as error:
        print(f"llama_jev.label_sheet: cannot open the storage folder {args.persist_dir}: {error}", file=sys.stderr)
        return 2
    try:
        sheet = write_label_sheet(
            args.records,
            docstore,
            args.out,
            sample=args.sample,
            seed=args.seed,
            purpose=args.purpose,
            version=args.version,
        )
    except (CalibrationInputError, ValueError) as error:
        print(f"llama_jev.label_sheet: {error}", file=sys.stderr)
        return 2
    print(
        f"wrote {sheet.rows} rows from {sheet.decisions} decisions to {sheet.path}"
        + (f" ({sheet.missing_text} without text: not in the docstore)" if sheet.missing_text else "")
    )
    print(
        "fill 'relevant' (true/false), then: "
        f"python -m llama_jev.calibrate --records {args.records} --labels {args.out}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
