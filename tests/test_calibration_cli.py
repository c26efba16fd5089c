"""``python -m llama_jev.calibrate`` end to end: exit codes, --json, the report.

The exit-code contract runs as real subprocesses; the other behaviours call ``main(argv)``
in-process (same code, without paying an interpreter start per case).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from llama_jev.calibrate import main
from llama_jev.core.records import QUERY_KEY_SECRET_ENVIRONMENT

from .calibration_support import SECRET, overconfident_log, record, write_jsonl

ROOT = Path(__file__).resolve().parents[1]


def run(*args: str | Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    environment = {k: v for k, v in os.environ.items() if k != QUERY_KEY_SECRET_ENVIRONMENT}
    environment.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "llama_jev.calibrate", *map(str, args)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env=environment,
        check=False,
    )


def cli(capsys: pytest.CaptureFixture[str], *args: str | Path) -> tuple[int, str, str]:
    """``main(argv)`` in-process: (exit status, stdout, stderr)."""
    code = main([str(arg) for arg in args])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.fixture(scope="module")
def log(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    folder = tmp_path_factory.mktemp("log")
    records, labels = overconfident_log(250, seed=21)
    return write_jsonl(folder / "records.jsonl", records), write_jsonl(folder / "labels.jsonl", labels)


@pytest.mark.slow
def test_recommendation_exits_0_with_the_json_keys_and_writes_the_report(
    log: tuple[Path, Path], tmp_path: Path
) -> None:
    records, labels = log
    report = tmp_path / "report.html"
    result = run("--records", records, "--labels", labels, "--target-precision", "0.8", "--min-npv", "0.9",
                 "--report", report, "--json")  # fmt: skip
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["labels"] == 2000
    assert set(data["recommended"]) == {"reject", "accept"}
    assert 0 <= data["recommended"]["reject"] < data["recommended"]["accept"] <= 1
    assert data["reason"] is None
    assert {"precision", "npv", "coverage", "uncertain"} <= set(data["holdout"])
    assert all(isinstance(data["holdout"][key], float) for key in ("precision", "npv", "coverage", "uncertain"))
    assert isinstance(data["ece"], float)
    assert isinstance(data["brier"], float)
    row = data["thresholds"][0]
    assert {"accept", "precision", "precision_lower", "recall", "coverage"} <= set(row)
    page = report.read_text(encoding="utf-8")
    assert page.startswith("<!DOCTYPE html>")
    assert "<svg" in page
    assert "<script" not in page


def test_same_seed_same_answer_other_seed_other_split(
    log: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    records, labels = log
    first = json.loads(cli(capsys, "--records", records, "--labels", labels, "--json", "--seed", "3")[1])
    again = json.loads(cli(capsys, "--records", records, "--labels", labels, "--json", "--seed", "3")[1])
    other = json.loads(cli(capsys, "--records", records, "--labels", labels, "--json", "--seed", "4")[1])
    assert first == again
    assert first["split"] != other["split"] or first["thresholds"] != other["thresholds"]


@pytest.mark.slow
def test_targets_not_met_exit_1_with_a_reason(log: tuple[Path, Path], tmp_path: Path) -> None:
    records, labels = log
    report = tmp_path / "report.html"
    result = run("--records", records, "--labels", labels, "--target-precision", "0.995", "--json", "--report", report)
    assert result.returncode == 1
    data = json.loads(result.stdout)
    assert data["recommended"] is None
    assert "0.995" in data["reason"]
    assert data["holdout"] is None
    assert "No thresholds recommended" in report.read_text(encoding="utf-8")


def test_human_output_without_json(log: tuple[Path, Path], capsys: pytest.CaptureFixture[str]) -> None:
    records, labels = log
    code, out, _ = cli(
        capsys, "--records", records, "--labels", labels, "--target-precision", "0.8", "--min-npv", "0.9"
    )
    assert code == 0
    assert "recommended: reject=" in out
    assert "held out: precision" in out


@pytest.mark.slow
def test_too_few_labels_exit_2(tmp_path: Path) -> None:
    records, labels = overconfident_log(5, seed=22)  # 40 labels
    result = run("--records", write_jsonl(tmp_path / "r.jsonl", records),
                 "--labels", write_jsonl(tmp_path / "l.jsonl", labels), "--json")  # fmt: skip
    assert result.returncode == 2
    assert "40 joined labels (need at least 50: 10 more)" in result.stderr
    assert f"Label at least 10 more pairs into {tmp_path / 'l.jsonl'}" in result.stderr
    assert f"--exclude {tmp_path / 'l.jsonl'} draws only pairs not labelled yet" in result.stderr
    data = json.loads(result.stdout)
    assert data["labels"] == 40
    assert data["labels_needed"] == 10
    assert data["recommended"] is None


@pytest.mark.slow
def test_unreadable_jsonl_exit_2_naming_file_and_line(tmp_path: Path, log: tuple[Path, Path]) -> None:
    _, labels = log
    records = tmp_path / "broken.jsonl"
    records.write_text(record("a", {"n": 0.5}).to_json() + "\n" + "{not json\n", encoding="utf-8")
    result = run("--records", records, "--labels", labels)
    assert result.returncode == 2
    assert f"{records}:2: not valid JSON" in result.stderr


def test_mixed_versions_exit_2_unless_selected(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    records, labels = overconfident_log(20, seed=23)
    records.append(record("other", {"x": 0.5}, version="v2"))
    args = [
        "--records",
        write_jsonl(tmp_path / "r.jsonl", records),
        "--labels",
        write_jsonl(tmp_path / "l.jsonl", labels),
    ]
    code, _, err = cli(capsys, *args)
    assert code == 2
    assert "--version" in err
    code, out, _ = cli(capsys, *args, "--version", "v1", "--json")
    assert json.loads(out)["labels"] == 160


def test_labels_by_query_use_the_secret_flag_or_environment(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(QUERY_KEY_SECRET_ENVIRONMENT, raising=False)
    records, labels = overconfident_log(60, seed=24, by_query=True)
    args = ["--records", write_jsonl(tmp_path / "r.jsonl", records),
            "--labels", write_jsonl(tmp_path / "l.jsonl", labels),
            "--target-precision", "0.7", "--min-npv", "0.8", "--json"]  # fmt: skip
    code, _, err = cli(capsys, *args)
    assert code == 2
    assert "l.jsonl:1" in err
    assert QUERY_KEY_SECRET_ENVIRONMENT in err
    code, with_flag, err = cli(capsys, *args, "--query-key-secret", SECRET)
    assert code != 2, err  # read and joined (whether the held-out split proves it is another matter)
    assert json.loads(with_flag)["labels"] == 480
    assert SECRET not in with_flag
    monkeypatch.setenv(QUERY_KEY_SECRET_ENVIRONMENT, SECRET)
    assert json.loads(cli(capsys, *args)[1]) == json.loads(with_flag)


def test_bad_flag_values_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as stopped:
        main(["--records", "r", "--labels", "l", "--holdout", "1.5"])
    assert stopped.value.code == 2
    assert "--holdout" in capsys.readouterr().err


def test_the_calibration_function_works_after_the_cli_module_is_imported() -> None:
    import llama_jev.calibrate as cli_module
    import llama_jev.calibration

    records, labels = overconfident_log(10, seed=25)
    assert not callable(cli_module)
    assert llama_jev.calibration.calibrate(records, labels, target_precision=0.5, min_npv=0.5).labels == 80
