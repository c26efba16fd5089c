"""``python -m llama_jev.label_sheet``: the sheet a person labels.

From a labelling sample (``ExecutionOptions(label_sampler=LabelSampler(...))``, or
``collect(..., samples=...)``), which holds each query and passage as the judge saw them:

    python -m llama_jev.label_sheet --samples samples.jsonl --out sheet.csv [--size 300] [--seed 0]
        [--exclude labels.jsonl]

Columns ``decision_id, node_id, question, passage, relevant`` (blank): blind (no p) and shuffled,
drawn stratified over p so the band where thresholds are chosen is covered. Label it in the
browser with ``python -m llama_jev.label sheet.csv --out labels.jsonl``, or in a spreadsheet.
A later sheet with ``--exclude labels.jsonl`` leaves out every pair labelled there already, so it
is labelled into the same file and adds only new pairs.

From SHADOW decision records and your own index (the records hold no query text, so this sheet
has none: prefer a labelling sample):

    python -m llama_jev.label_sheet --records decisions.jsonl --persist-dir ./storage \\
        --out sheet.csv [--sample 100] [--seed 0] [--purpose P] [--version V]
    python -m llama_jev.label_sheet --records decisions.jsonl --qdrant-path ./qdrant \\
        --collection kb --out sheet.csv          (or --qdrant-url http://localhost:6333)

Node text comes from a LlamaIndex storage folder (``index.storage_context.persist(dir)``, which
holds ``docstore.json``) or from a Qdrant collection written by LlamaIndex (local folder or
server; ``QDRANT_API_KEY`` is sent when set). For any other store call
``llama_jev.calibration.write_label_sheet`` with your index.
Then: ``python -m llama_jev.calibrate --records decisions.jsonl --labels labels.jsonl``.
Exit status: 0 written, 2 unusable input.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from collections.abc import Sequence
from typing import Any

from llama_jev.calibration.analysis import MIN_LABELS, MIN_PER_CLASS
from llama_jev.calibration.records import CalibrationInputError
from llama_jev.calibration.samples import SampleSheet, write_sample_sheet
from llama_jev.calibration.sheet import write_label_sheet

__all__ = ["main"]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m llama_jev.label_sheet",
        description=(
            "Write the sheet a person labels: from a labelling sample (--samples, with the question), or from a "
            "SHADOW log (--records) with the text from your own index."
        ),
    )
    parser.add_argument("--samples", help="a LabelSampler file (JSONL with the query and the passages)")
    parser.add_argument("--size", type=int, default=300, help="with --samples: pairs in the sheet (default 300)")
    parser.add_argument(
        "--with-p", action="store_true", help="with --samples: add the judge's p (the sheet is blind by default)"
    )
    parser.add_argument(
        "--exclude",
        action="append",
        default=[],
        metavar="LABELS",
        help="with --samples: leave out the pairs this labels file answers already (repeatable)",
    )
    parser.add_argument("--records", help="decision records, one JSON object per line")
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--persist-dir", help="a LlamaIndex storage folder holding docstore.json")
    source.add_argument("--qdrant-path", help="a Qdrant local-mode folder (with --collection)")
    source.add_argument("--qdrant-url", help="a Qdrant server (with --collection; QDRANT_API_KEY if set)")
    parser.add_argument("--collection", help="the Qdrant collection holding the nodes")
    parser.add_argument("--out", required=True, help="the sheet to write: .csv, or JSONL for any other suffix")
    parser.add_argument("--sample", type=int, default=100, help="how many decisions to sample (default 100)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the sample (default 0)")
    parser.add_argument("--purpose", help="use only records of this purpose")
    parser.add_argument("--version", help="use only records of this version")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI with ``argv`` (default: ``sys.argv[1:]``) and return the exit status."""
    parser = _parser()
    args = parser.parse_args(argv)
    if args.samples is not None:
        return _from_samples(args)
    if args.records is None:
        parser.error("give --samples SAMPLES.jsonl (recommended), or --records with --persist-dir / --qdrant-*")
    if args.persist_dir is None and args.qdrant_path is None and args.qdrant_url is None:
        parser.error("--records needs the text's source: --persist-dir, or --qdrant-path / --qdrant-url")
    if args.persist_dir is None and not args.collection:
        parser.error("--qdrant-path / --qdrant-url need --collection NAME")
    try:
        source = _source(args)
    except (OSError, ValueError, ImportError, RuntimeError) as error:
        where = args.persist_dir or args.qdrant_path or args.qdrant_url
        hint = (
            " (a storage folder written by index.storage_context.persist(); if your text lives in Qdrant, "
            "use --qdrant-path or --qdrant-url with --collection)"
            if args.persist_dir
            else ""
        )
        print(f"llama_jev.label_sheet: cannot open {where}: {type(error).__name__}: {error}{hint}", file=sys.stderr)
        return 2
    try:
        sheet = write_label_sheet(
            args.records,
            source,
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


def _from_samples(args: argparse.Namespace) -> int:
    try:
        sheet = write_sample_sheet(
            args.samples, args.out, size=args.size, seed=args.seed, blind=not args.with_p, exclude=args.exclude
        )
    except (CalibrationInputError, ValueError, OSError) as error:
        print(f"llama_jev.label_sheet: {error}", file=sys.stderr)
        return 2
    spread = ", ".join(f"{i / 10:.1f}-{(i + 1) / 10:.1f}: {n}" for i, n in enumerate(sheet.strata) if n)
    of = (
        f"of {sheet.available} not labelled yet, {sheet.excluded} labelled already left out"
        if sheet.excluded
        else f"of {sheet.available} sampled"
    )
    print(f"wrote {sheet.rows} pairs ({of}) to {sheet.path}; rows per band of p: {spread}")
    labels = args.exclude[0] if args.exclude else "labels.jsonl"
    print(_short_sheet_note(sheet, args, labels), file=sys.stderr, end="")
    print(f"label them: python -m llama_jev.label {shlex.quote(args.out)} --out {shlex.quote(labels)}")
    return 0


def _short_sheet_note(sheet: SampleSheet, args: argparse.Namespace, labels: str) -> str:
    """A line for stderr when this sheet and the pairs labelled already make fewer than calibrate needs."""
    have = sheet.rows + sheet.excluded
    if have >= MIN_LABELS:
        return ""
    # Not refused: several sheets may go into one labels file, each drawing only pairs not labelled yet.
    if sheet.rows < sheet.available:
        more = (
            f"ask for --size {min(MIN_LABELS - sheet.excluded, sheet.available)} "
            f"(the sample holds {sheet.available} pairs not labelled yet)"
        )
    else:
        command = shlex.join(
            [
                "python",
                "-m",
                "llama_jev.label_sheet",
                "--samples",
                args.samples,
                "--out",
                "more.csv",
                "--exclude",
                labels,
            ]
        )
        more = (
            "the sample holds no more pairs: keep SHADOW sampling a while longer, then draw only new pairs "
            f"into the same labels file with: {command}"
        )
    already = f" and the {sheet.excluded} labelled already" if sheet.excluded else ""
    return (
        f"llama_jev.label_sheet: note: {sheet.rows} pairs{already} make {have}, {MIN_LABELS - have} fewer than the "
        f"{MIN_LABELS} labels calibrate needs (at least {MIN_PER_CLASS} relevant and {MIN_PER_CLASS} not); {more}\n"
    )


def _source(args: argparse.Namespace) -> Any:
    """The docstore or vector store the sheet's text is read from."""
    if args.persist_dir is not None:
        from llama_index.core import StorageContext

        return StorageContext.from_defaults(persist_dir=args.persist_dir).docstore
    try:
        from llama_index.vector_stores.qdrant import QdrantVectorStore
        from qdrant_client import QdrantClient
    except ImportError as error:
        raise ImportError('reading from Qdrant needs the qdrant extra: pip install -e ".[qdrant]"') from error
    if args.qdrant_path is not None:
        client = QdrantClient(path=args.qdrant_path)
    else:
        client = QdrantClient(url=args.qdrant_url, api_key=os.environ.get("QDRANT_API_KEY") or None)
    if not client.collection_exists(args.collection):
        raise ValueError(f"no collection named {args.collection!r}")
    return QdrantVectorStore(collection_name=args.collection, client=client)


if __name__ == "__main__":
    sys.exit(main())
