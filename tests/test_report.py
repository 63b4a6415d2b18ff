"""Tests for harness.report on synthetic records (partial, duplicated and malformed)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from harness.cli import main as cli_main
from harness.record import Record, RecordError
from harness.record import load_records as load_found
from harness.report import _with_text, build_report
from harness.tables import (
    LONG_COLUMNS,
    build_tables,
    latest_records,
    records_frame,
    torch_sort_key,
    verdict_pivot,
    verdict_table,
)


def load_records(paths):
    found, skipped = load_found(paths)
    return records_frame(found), skipped


def validate_record(data):
    try:
        Record.from_json(data)
    except RecordError as exc:
        return str(exc)
    return None


def pivot_table(cells, device):
    return verdict_pivot(_with_text(cells), device, "text")


def main(argv):
    return cli_main(["report", *argv])

CPU_VERSIONS = ["2.9.1", "2.11.0", "2.12.1", "2.13.0+cpu"]


def make_record(
    scenario: str,
    variant: str,
    torch: str,
    status: str,
    *,
    expected: str | None = None,
    patches: list[str] | None = None,
    device: str = "cpu",
    world_size: int = 2,
    started_at: str = "2026-11-20T10:00:00Z",
    install: dict[str, str] | None = None,
    **extra: Any,
) -> dict[str, Any]:
    """One schema-1 record; ``expected`` defaults to ``status``."""
    expected = status if expected is None else expected
    build = torch.partition("+")[2] or ("cu128" if device == "cuda" else "cpu")
    record: dict[str, Any] = {
        "schema": 1,
        "run_id": f"run-{torch}",
        "started_at": started_at,
        "scenario": scenario,
        "variant": variant,
        "patches_module": "fsdp_patches",
        "patches": patches or [],
        "patch_install": {n: {"status": s, "reason": f"{s} on {torch}"} for n, s in (install or {}).items()},
        "torch": torch,
        "torch_git": "abc123",
        "device": device,
        "backend": "nccl" if device == "cuda" else "gloo",
        "world_size": world_size,
        "mesh": [world_size],
        "status": status,
        "expected": expected,
        "expected_match": None,
        "as_expected": status == expected,
        "exc_type": None,
        "exc_msg": None,
        "failing_rank": None,
        "traceback": None,
        "max_abs_diff": 0.0 if status == "pass" else None,
        "max_rel_diff": 0.0 if status == "pass" else None,
        "worst": None,
        "diffs": [],
        "grad_norm": 1.0,
        "ref_grad_norm": 1.0,
        "duration_s": 1.5,
        "reason": None,
        "env": {
            "python": "3.11.7",
            "torch": torch,
            "torch_build": build,
            "cuda": "12.8" if device == "cuda" else None,
            "gpu": "NVIDIA H200" if device == "cuda" else None,
            "host": f"host-{device}",
            "platform": "Linux-x86_64",
        },
    }
    return record | extra


def write_jsonl(path: Path, lines: list[dict[str, Any] | str]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(l if isinstance(l, str) else json.dumps(l) for l in lines) + "\n", encoding="utf-8")
    return path


UNUSED = ["unused_param_reduction"]
ERR = {"exc_type": "RuntimeError", "exc_msg": "Expected to have finished reduction in the prior iteration"}


def sample_records() -> list[dict[str, Any]]:
    """cpu: 3 scenarios x 4 versions with holes; cuda: one version; one superseded duplicate."""
    r = make_record
    return [
        # unused_params: needed on old versions, fixed upstream in 2.12.1, patched run missing on 2.13
        r("unused_params", "vanilla", "2.9.1", "error", patches=UNUSED, **ERR),
        r("unused_params", "patched", "2.9.1", "pass", patches=UNUSED, install={UNUSED[0]: "installed"}),
        r("unused_params", "vanilla", "2.11.0", "error", patches=UNUSED, **ERR),
        r("unused_params", "patched", "2.11.0", "pass", patches=UNUSED),
        r("unused_params", "vanilla", "2.12.1", "pass", expected="error", patches=UNUSED),
        r("unused_params", "patched", "2.12.1", "pass", patches=UNUSED),
        r("unused_params", "vanilla", "2.13.0+cpu", "pass", patches=UNUSED),
        # baseline: broken by the patches on 2.12.1, never run on 2.13
        r("baseline_mlp", "vanilla", "2.9.1", "error", started_at="2026-11-19T09:00:00Z", **ERR),  # superseded
        r("baseline_mlp", "vanilla", "2.9.1", "pass"),
        r("baseline_mlp", "patched", "2.9.1", "pass"),
        r("baseline_mlp", "vanilla", "2.11.0", "pass"),
        r("baseline_mlp", "patched", "2.11.0", "pass", started_at="2026-11-21T08:00:00Z"),
        r("baseline_mlp", "vanilla", "2.12.1", "pass"),
        r("baseline_mlp", "patched", "2.12.1", "mismatch", expected="pass", max_abs_diff=0.5,
          max_rel_diff=0.25, worst="step 0 grad cond.weight"),
        # grad_accum (world size 4): only run on 2.13, where the patch backports a missing feature
        r("grad_accum", "vanilla", "2.13.0+cpu", "skip", patches=["grad_accum_fix"], world_size=4,
          reason="no_sync missing"),
        r("grad_accum", "patched", "2.13.0+cpu", "pass", patches=["grad_accum_fix"], world_size=4),
        # cuda: fixed upstream, patch reports not-applicable
        r("unused_params", "vanilla", "2.13.0+cu128", "pass", patches=UNUSED, device="cuda"),
        r("unused_params", "patched", "2.13.0+cu128", "pass", patches=UNUSED, device="cuda",
          install={UNUSED[0]: "not-applicable"}),
    ]


@pytest.fixture()
def records_dir(tmp_path: Path) -> Path:
    recs = sample_records()
    folder = tmp_path / "runs"
    write_jsonl(folder / "cpu" / "a.jsonl", recs[:10])
    write_jsonl(folder / "cpu" / "b.jsonl", recs[10:16])
    write_jsonl(folder / "cuda.jsonl", recs[16:])
    good = make_record("baseline_mlp", "vanilla", "2.11.0", "pass", started_at="2026-11-01T00:00:00Z")
    no_status = {k: v for k, v in make_record("x", "vanilla", "2.11.0", "pass").items() if k != "status"}
    write_jsonl(folder / "bad.jsonl", [
        good,
        '{"schema": 1, "scenario": "truncated',
        no_status,
        make_record("x", "vanilla", "2.11.0", "pass", world_size="2"),
        "",
        make_record("x", "vanilla", "2.11.0", "exploded"),
        "[1, 2]",
    ])
    (folder / "notes.txt").write_text("not a record file\n")
    return folder


def test_load_records_skips_and_names_malformed_lines(records_dir: Path) -> None:
    records, skipped = load_records([records_dir])
    bad = records_dir / "bad.jsonl"
    assert len(records) == len(sample_records()) + 1
    assert [s.split(": ", 1)[0] for s in skipped] == [f"{bad}:2", f"{bad}:3", f"{bad}:4", f"{bad}:6", f"{bad}:7"]
    assert skipped[0].startswith(f"{bad}:2: bad JSON")
    assert skipped[1] == f"{bad}:3: missing key 'status'"
    assert skipped[2] == f"{bad}:4: key 'world_size' should be int, got str"
    assert skipped[3] == f"{bad}:6: unknown status 'exploded'"
    assert skipped[4] == f"{bad}:7: expected a JSON object, got list"
    assert records.loc[0, "source"] == f"{bad}:1"
    assert set(records["env_host"]) == {"host-cpu", "host-cuda"}


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        ({}, None),
        ({"schema": 2}, "unsupported schema 2"),
        ({"variant": "both"}, "unknown variant 'both'"),
        ({"as_expected": "yes"}, "key 'as_expected' should be bool, got str"),
        ({"world_size": True}, "key 'world_size' should be int, got bool"),
        ({"max_abs_diff": "big"}, "key 'max_abs_diff' should be float, got str"),
        ({"max_abs_diff": None, "exc_msg": None}, None),
        ({"patches": ["a", 3]}, "key 'patches' should be a list of str"),
        ({"patch_install": {"a": {"status": "maybe"}}}, "bad patch_install entry for 'a'"),
        ({"extra_key": {"anything": 1}}, None),
    ],
)
def test_validate_record(change: dict[str, Any], problem: str | None) -> None:
    assert validate_record(make_record("s", "vanilla", "2.12.1", "pass") | change) == problem


def test_latest_record_wins(records_dir: Path) -> None:
    latest = latest_records(load_records([records_dir])[0])
    mlp = latest[(latest["scenario"] == "baseline_mlp") & (latest["torch"] == "2.9.1") & (latest["variant"] == "vanilla")]
    assert list(mlp["status"]) == ["pass"]
    mlp11 = latest[(latest["scenario"] == "baseline_mlp") & (latest["torch"] == "2.11.0") & (latest["variant"] == "vanilla")]
    assert len(mlp11) == 1 and mlp11.iloc[0]["started_at"] == "2026-11-20T10:00:00Z"


def test_latest_record_compares_timestamps_not_strings(tmp_path: Path) -> None:
    older = make_record("s", "vanilla", "2.12.1", "error", expected="error|mismatch",
                        started_at="2026-11-20T10:00:00Z", installed_patches=[], timeout_s=60)
    newer = make_record("s", "vanilla", "2.12.1", "pass", started_at="2026-11-20T11:00:00+00:00")
    write_jsonl(tmp_path / "r.jsonl", [newer, older])  # newer first in the file, "+00:00" sorts before "Z"
    records, skipped = load_records([tmp_path / "r.jsonl"])
    assert skipped == []
    assert list(latest_records(records)["status"]) == ["pass"]


def test_torch_versions_sort_numerically() -> None:
    assert sorted(["2.13.0+cpu", "2.9.1", "2.11.0", "nightly", "2.12.1"], key=torch_sort_key) == [
        "2.9.1", "2.11.0", "2.12.1", "2.13.0+cpu", "nightly"]


def test_pivot_contents_and_not_run_cells(records_dir: Path) -> None:
    tables = build_tables([records_dir])
    pivot = pivot_table(tables.cells, "cpu")
    assert list(pivot.columns) == CPU_VERSIONS
    assert list(pivot.index) == [("baseline_mlp", 2), ("grad_accum", 4), ("unused_params", 2)]
    assert pivot.loc[("unused_params", 2)].tolist() == [
        "patch needed (error / pass)",
        "patch needed (error / pass)",
        "fixed upstream (pass / pass) ⚠",
        "not run (pass / —)",
    ]
    assert pivot.loc[("baseline_mlp", 2)].tolist() == [
        "ok (pass / pass)", "ok (pass / pass)", "patch broken (pass / mismatch) ⚠", "not run"]
    assert pivot.loc[("grad_accum", 4)].tolist() == ["not run", "not run", "not run", "patch needed (skip / pass)"]
    cuda = pivot_table(tables.cells, "cuda")
    assert list(cuda.columns) == ["2.13.0+cu128"]
    assert cuda.loc[("unused_params", 2), "2.13.0+cu128"] == "fixed upstream (pass / pass)"
    assert cuda.loc[("grad_accum", 4), "2.13.0+cu128"] == "not run"


def test_verdict_table_long_form(records_dir: Path) -> None:
    cells = verdict_table(latest_records(load_records([records_dir])[0]))
    assert list(cells.columns) == list(LONG_COLUMNS)
    assert len(cells) == 3 * 4 + 3 * 1
    broken = cells[cells["verdict"] == "patch broken"].iloc[0]
    assert (broken["scenario"], broken["torch"], broken["patched_max_abs_diff"]) == ("baseline_mlp", "2.12.1", 0.5)
    assert broken["unexpected"] == "patched regression: mismatch, expected pass"
    assert broken["worst"] == "step 0 grad cond.weight"
    needed = cells[(cells["scenario"] == "unused_params") & (cells["torch"] == "2.9.1")].iloc[0]
    assert needed["vanilla_exc"] == "RuntimeError: Expected to have finished reduction in the prior iteration"
    fixed = cells[(cells["scenario"] == "unused_params") & (cells["torch"] == "2.12.1")].iloc[0]
    assert fixed["unexpected"] == "vanilla unexpectedly passes (expected error)"


def test_patch_summary(records_dir: Path) -> None:
    patches = build_tables([records_dir]).patches
    status = {(r.patch, r.device, r.torch): r.status for r in patches.itertuples()}
    assert [status[("unused_param_reduction", "cpu", v)] for v in CPU_VERSIONS] == [
        "needed", "needed", "retire", "not run"]
    assert status[("unused_param_reduction", "cuda", "2.13.0+cu128")] == "retire"
    assert [status[("grad_accum_fix", "cpu", v)] for v in CPU_VERSIONS] == [
        "not run", "not run", "not run", "needed"]
    assert len(patches) == 2 * (4 + 1)


def test_environment_rows(records_dir: Path) -> None:
    env = build_tables([records_dir]).environment.set_index(["device", "torch"])
    assert env.loc[("cpu", "2.13.0+cpu"), "torch build"] == "cpu"
    assert env.loc[("cuda", "2.13.0+cu128"), "torch build"] == "cu128"
    assert env.loc[("cuda", "2.13.0+cu128"), "device name"] == "NVIDIA H200"
    assert env.loc[("cpu", "2.11.0"), "date"] == "2026-11-20 – 2026-11-21"
    assert env.loc[("cpu", "2.9.1"), "date"] == "2026-11-20"  # the superseded 11-19 record is not shown
    assert env.loc[("cpu", "2.9.1"), "python"] == "3.11.7"


def test_build_report_writes_three_files(records_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    paths = build_report([records_dir], out)
    assert {k: p.name for k, p in paths.items()} == {"md": "compat.md", "html": "compat.html", "csv": "compat.csv"}
    assert all(p.is_file() and p.stat().st_size > 0 for p in paths.values())

    md = re.sub(r" +", " ", paths["md"].read_text(encoding="utf-8"))  # tabulate pads columns
    assert "## Verdicts: cpu" in md and "## Verdicts: cuda" in md
    assert "| scenario | world size | 2.9.1 | 2.11.0 | 2.12.1 | 2.13.0+cpu |" in md
    assert ("| unused_params | 2 | patch needed (error / pass) | patch needed (error / pass) "
            "| fixed upstream (pass / pass) ⚠ | not run (pass / —) |") in md
    assert "| baseline_mlp | 2 | ok (pass / pass) | ok (pass / pass) | patch broken (pass / mismatch) ⚠ | not run |" in md
    assert "| *env: torch build* | | cpu | cpu | cpu | cpu |" in md
    assert "| unused_param_reduction | needed | needed | retire | not run |" in md
    assert f"{records_dir / 'bad.jsonl'}:3: missing key 'status'" in md
    assert "RuntimeError: Expected to have finished reduction" in md

    page = paths["html"].read_text(encoding="utf-8")
    assert page.startswith("<!DOCTYPE html>") and "<style>" in page
    assert "<script" not in page and "http://" not in page and "https://" not in page
    cells = dict(re.findall(r'<td [^>]*class="data [^"]*?(v-[a-z-]+)"[^>]*>([^<]*)</td>', page)[::-1])
    assert "v-patch-broken" in cells and "v-patch-needed" in cells and "v-not-run" in cells
    assert "patched: mismatch; max abs diff 0.5" in page  # hover title on the pivot cell
    assert "vanilla: error — RuntimeError: Expected to have finished reduction" in page
    assert re.search(r'<td [^>]*class="data [^"]*v-patch-broken"[^>]*>patch broken</td>', page)  # details, colored
    assert ".v-patch-broken { background: #ef9a9a; }" in page
    assert "bad.jsonl:2: bad JSON" in page

    csv = pd.read_csv(paths["csv"], keep_default_na=False)
    assert list(csv.columns) == list(LONG_COLUMNS)
    assert len(csv) == 15
    row = csv[(csv["scenario"] == "unused_params") & (csv["torch"] == "2.13.0+cpu")].iloc[0]
    assert (row["vanilla"], row["patched"], row["verdict"]) == ("pass", "", "not run")
    assert sorted(csv["verdict"].value_counts().items()) == [
        ("fixed upstream", 2), ("not run", 7), ("ok", 2), ("patch broken", 1), ("patch needed", 3)]


def test_build_tables_without_records_raises(tmp_path: Path) -> None:
    write_jsonl(tmp_path / "bad.jsonl", ["{oops"])
    with pytest.raises(RecordError, match=r"no valid records found .* \(1 malformed lines skipped\)"):
        build_tables([tmp_path])


def test_main_writes_report(records_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "reports"
    assert main(["--records", str(records_dir / "cpu"), "--records", str(records_dir / "bad.jsonl"),
                 "--out", str(out)]) == 0
    captured = capsys.readouterr()
    assert captured.out.split() == [str(out / "compat.md"), str(out / "compat.html"), str(out / "compat.csv")]
    assert "skipped 5 malformed lines" in captured.err
    assert "cuda" not in (out / "compat.csv").read_text()


@pytest.mark.parametrize("kind", ["missing path", "empty folder", "only malformed"])
def test_main_bad_input_exits_2(kind: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    target = tmp_path / "in"
    if kind == "empty folder":
        target.mkdir()
    elif kind == "only malformed":
        write_jsonl(target / "x.jsonl", ["not json"])
    assert main(["--records", str(target), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and err.startswith("error: ")
    assert ("no such file or folder" if kind == "missing path" else "no valid records found") in err
    assert not (tmp_path / "out").exists()
