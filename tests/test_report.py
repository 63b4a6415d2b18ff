"""The report on synthetic records (partial, duplicated and malformed): tables, the
decision-first lifecycle, Markdown, HTML and CSV."""

from __future__ import annotations

import html
import json
import re
from pathlib import Path
from typing import Any

import pytest

from harness.cli import main as cli_main
from harness.results.decisions import lifecycle, version_ranges
from harness.results.reading import load_records
from harness.results.record import RecordError
from harness.results.report import build_report
from harness.results.safe import read_report_csv
from harness.results.tables import LONG_COLUMNS, build_tables, latest_records, records_frame
from harness.versions import torch_sort_key

CPU_VERSIONS = ["2.9.1", "2.11.0", "2.12.1", "2.13.0"]
A = "unused_param_reduction"


def record(scenario: str, variant: str, torch: str, status: str, *, expected: str | None = None,
           patches: list[str] | None = None, device: str = "cpu", world_size: int = 2,
           started_at: str = "2026-11-20T10:00:00Z", install: dict[str, str] | None = None, **extra: Any) -> dict:
    """One record as written to disk; ``expected`` defaults to ``status``."""
    expected = status if expected is None else expected
    build = torch.partition("+")[2] or ("cu128" if device == "cuda" else "cpu")
    return {
        "schema": 2, "run_id": f"run-{torch}", "started_at": started_at, "scenario": scenario, "variant": variant,
        "patches_module": "fsdp_patches", "patches_module_id": "fsdp_patches (fsdp_patches, sha256 abc)",
        "patches": patches or [],
        "patch_install": {n: {"status": s, "reason": f"{s} on {torch}"} for n, s in (install or {}).items()},
        "torch": torch, "device": device, "backend": "nccl" if device == "cuda" else "gloo",
        "world_size": world_size, "mesh": [world_size], "status": status, "expected": expected,
        "as_expected": status in expected.split("|"), "max_abs_diff": 0.0 if status == "pass" else None,
        "env": {"python": "3.11.7", "torch": torch, "torch_build": build, "cuda": "12.8" if device == "cuda" else None,
                "gpu": "NVIDIA H200" if device == "cuda" else None, "host": f"host-{device}", "platform": "Linux-x86_64"},
    } | extra


def write_jsonl(path: Path, lines: list) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(x if isinstance(x, str) else json.dumps(x) for x in lines) + "\n", encoding="utf-8")
    return path


ERR = {"exc_type": "RuntimeError", "exc_msg": "Expected to have finished reduction in the prior iteration"}


def sample_records() -> list[dict]:
    """cpu: 3 scenarios x 4 versions with holes; cuda: one version; one superseded duplicate."""
    r = record
    return [
        # unused_params: needed on old versions, fixed upstream in 2.12.1, patched run missing on 2.13
        r("unused_params", "vanilla", "2.9.1", "error", patches=[A], fixed_by=A, **ERR),
        r("unused_params", "patched", "2.9.1", "pass", patches=[A], install={A: "installed"}),
        r("unused_params", "vanilla", "2.11.0", "error", patches=[A], fixed_by=A, **ERR),
        r("unused_params", "patched", "2.11.0", "pass", patches=[A]),
        r("unused_params", "vanilla", "2.12.1", "pass", expected="error", patches=[A]),
        r("unused_params", "patched", "2.12.1", "pass", patches=[A]),
        r("unused_params", "vanilla", "2.13.0+cpu", "pass", patches=[A]),
        # baseline: broken by the deployed set on 2.12.1, never run on 2.13
        r("baseline_mlp", "vanilla", "2.9.1", "error", started_at="2026-11-19T09:00:00Z", **ERR),  # superseded
        r("baseline_mlp", "vanilla", "2.9.1", "pass"),
        r("baseline_mlp", "deployed", "2.9.1", "pass"),
        r("baseline_mlp", "vanilla", "2.11.0", "pass"),
        r("baseline_mlp", "deployed", "2.11.0", "pass", started_at="2026-11-21T08:00:00Z"),
        r("baseline_mlp", "vanilla", "2.12.1", "pass"),
        r("baseline_mlp", "deployed", "2.12.1", "mismatch", expected="pass", max_abs_diff=0.5, max_rel_diff=0.25,
          worst="step 0 grad cond.weight"),
        # grad_accum (world size 4): only run on 2.13, where the patch backports a missing feature
        r("grad_accum", "vanilla", "2.13.0+cpu", "skip", patches=["grad_accum_fix"], world_size=4,
          reason="no_sync missing"),
        r("grad_accum", "patched", "2.13.0+cpu", "pass", patches=["grad_accum_fix"], world_size=4),
        # cuda: fixed upstream, patch reports not-applicable
        r("unused_params", "vanilla", "2.13.0+cu128", "pass", patches=[A], device="cuda"),
        r("unused_params", "patched", "2.13.0+cu128", "pass", patches=[A], device="cuda", install={A: "not-applicable"}),
    ]


@pytest.fixture()
def records_dir(tmp_path: Path) -> Path:
    recs = sample_records()
    folder = tmp_path / "runs"
    write_jsonl(folder / "cpu" / "a.jsonl", recs[:10])
    write_jsonl(folder / "cpu" / "b.jsonl", recs[10:16])
    write_jsonl(folder / "cuda.jsonl", recs[16:])
    good = record("baseline_mlp", "vanilla", "2.11.0", "pass", started_at="2026-11-01T00:00:00Z")
    no_status = {k: v for k, v in record("x", "vanilla", "2.11.0", "pass").items() if k != "status"}
    write_jsonl(folder / "bad.jsonl", [good, '{"schema": 2, "scenario": "truncated', no_status,
                                       record("x", "vanilla", "2.11.0", "pass", world_size="2"), "",
                                       record("x", "vanilla", "2.11.0", "exploded"), "[1, 2]"])
    (folder / "notes.txt").write_text("not a record file\n")
    return folder


def test_load_records_skips_and_names_malformed_lines(records_dir: Path) -> None:
    found, skipped = load_records([records_dir])
    bad = records_dir / "bad.jsonl"
    assert len(found) == len(sample_records()) + 1
    assert [s.split(": ", 1)[0] for s in skipped] == [f"{bad}:2", f"{bad}:3", f"{bad}:4", f"{bad}:6", f"{bad}:7"]
    assert skipped[0].startswith(f"{bad}:2: bad JSON")
    assert skipped[1:] == [f"{bad}:3: missing key 'status'", f"{bad}:4: key 'world_size' should be int, got str",
                           f"{bad}:6: unknown status 'exploded'", f"{bad}:7: expected a JSON object, got list"]
    assert found[0][1] == f"{bad}:1"


def test_schema_1_records_still_load(tmp_path: Path) -> None:
    old = record("s", "patched", "2.12.1", "pass", schema=1)
    del old["patches_module_id"]
    (rec, _), = load_records([write_jsonl(tmp_path / "old.jsonl", [old])])[0]
    assert rec.schema == 1 and rec.patches_module_id == "" and rec.fixed_by is None


def test_latest_record_wins_by_timestamp_not_string(records_dir: Path, tmp_path: Path) -> None:
    latest = latest_records(records_frame(load_records([records_dir])[0]))
    mlp = latest[(latest["scenario"] == "baseline_mlp") & (latest["torch"] == "2.9.1") & (latest["variant"] == "vanilla")]
    assert list(mlp["status"]) == ["pass"]
    newer = record("s", "vanilla", "2.12.1", "pass", started_at="2026-11-20T11:00:00+00:00")
    older = record("s", "vanilla", "2.12.1", "error", started_at="2026-11-20T10:00:00Z")
    found, _ = load_records([write_jsonl(tmp_path / "r.jsonl", [newer, older])])
    assert list(latest_records(records_frame(found))["status"]) == ["pass"]


def test_torch_versions_sort_numerically() -> None:
    assert sorted(["2.13.0", "2.9.1", "2.11.0", "nightly", "2.12.1"], key=torch_sort_key) == [
        "2.9.1", "2.11.0", "2.12.1", "2.13.0", "nightly"]


def test_verdict_table_columns_are_releases(records_dir: Path) -> None:
    tables = build_tables([records_dir])
    cells = tables.cells
    assert list(cells.columns) == list(LONG_COLUMNS)
    assert tables.versions("cpu") == CPU_VERSIONS and tables.versions("cuda") == ["2.13.0"]
    verdict = {(r.scenario, r.torch, r.device): r.verdict for r in cells.itertuples()}
    assert [verdict[("unused_params", v, "cpu")] for v in CPU_VERSIONS] == [
        "patch needed", "patch needed", "fixed upstream", "not run"]
    assert [verdict[("baseline_mlp", v, "cpu")] for v in CPU_VERSIONS] == ["ok", "ok", "deployed set broken", "not run"]
    assert verdict[("grad_accum", "2.13.0", "cpu")] == "backport"
    broken = cells[cells["verdict"] == "deployed set broken"].iloc[0]
    assert broken["unexpected"] == "deployed regression: mismatch, expected pass"
    assert broken["worst"] == "step 0 grad cond.weight"
    needed = cells[(cells["scenario"] == "unused_params") & (cells["torch"] == "2.9.1")].iloc[0]
    assert needed["vanilla_exc"] == "RuntimeError: Expected to have finished reduction in the prior iteration"


def test_patch_summary_and_lifecycle(records_dir: Path) -> None:
    tables = build_tables([records_dir])
    status = {(r.patch, r.device, r.torch): r.status for r in tables.patches.itertuples()}
    assert [status[(A, "cpu", v)] for v in CPU_VERSIONS] == ["needed", "needed", "retire", "not run"]
    assert status[(A, "cuda", "2.13.0")] == "retire"
    assert status[("grad_accum_fix", "cpu", "2.13.0")] == "backport"
    life = lifecycle(tables.patches, "cpu", CPU_VERSIONS).set_index("patch")
    assert life.loc[A, "needed (keep)"] == "2.9.1–2.11.0"
    assert life.loc[A, "retire (fixed upstream)"] == "2.12.1 (shown by unused_params)"
    assert life.loc["grad_accum_fix", "backport (vanilla lacks the feature)"] == "2.13.0"
    deployed = tables.deployed.set_index(["device", "torch"])
    assert deployed.loc[("cpu", "2.12.1"), "not as documented"] == 1
    assert deployed.loc[("cpu", "2.12.1"), "where"] == "baseline_mlp w2"
    assert deployed.loc[("cpu", "2.9.1"), "not as documented"] == 0


def test_version_ranges() -> None:
    versions = ["2.7.1", "2.8.0", "2.9.1", "2.10.0", "2.15.0"]
    assert version_ranges(versions, {"2.7.1", "2.8.0", "2.10.0", "2.15.0"}) == "2.7.1–2.8.0, 2.10.0–2.15.0"
    assert version_ranges(versions, set()) == ""


def test_environment_rows_keep_the_builds(records_dir: Path) -> None:
    env = build_tables([records_dir]).environment.set_index(["device", "torch"])
    assert env.loc[("cpu", "2.13.0"), "torch build"] == "2.13.0+cpu"
    assert env.loc[("cuda", "2.13.0"), "torch build"] == "2.13.0+cu128"
    assert env.loc[("cuda", "2.13.0"), "device name"] == "NVIDIA H200"
    assert env.loc[("cpu", "2.11.0"), "date"] == "2026-11-20 – 2026-11-21"
    assert env.loc[("cpu", "2.9.1"), "date"] == "2026-11-20"  # the superseded 11-19 record is not shown


def test_build_report_writes_three_files(records_dir: Path, tmp_path: Path) -> None:
    paths = build_report([records_dir], tmp_path / "out")
    assert {k: p.name for k, p in paths.items()} == {"md": "compat.md", "html": "compat.html", "csv": "compat.csv",
                                                     "patches_csv": "compat-patches.csv"}
    md = re.sub(r" +", " ", paths["md"].read_text(encoding="utf-8"))  # tabulate pads columns
    assert md.index("## What to do with each patch: cpu") < md.index("## Scenario × torch: cpu")
    assert "Patches module under test: fsdp_patches (sha256 abc)." in md  # no folder, even from old records
    assert f"| {A} | 2.9.1–2.11.0 |" in md
    assert "| scenario | w | 2.9.1 | 2.11.0 | 2.12.1 | 2.13.0 |" in md
    assert "| unused_params | 2 | need | need | fixed ⚠ | – |" in md
    assert "| baseline_mlp | 2 | ok | ok | DEPLOYED ⚠ | – |" in md
    assert f"{records_dir / 'bad.jsonl'}:3: missing key 'status'" in md
    legend = md[md.index("## Bug legend"):md.index("## Details")]
    assert "| A | Ranks use different parameters |" in legend and "| K | Mixed parameter dtypes" in legend
    assert "| unused_param_reduction | FSDPModule.set_reduce_scatter_unused_params (2.13) | — |" in legend

    page = paths["html"].read_text(encoding="utf-8")
    assert page.startswith("<!DOCTYPE html>") and "<script" not in page and not re.search("https?:|//", page)
    assert re.search(r'class="data [^"]*v-deployed-set-broken"[^>]*><a href="#d-cpu-baseline_mlp-w2-2_12_1">', page)
    assert 'id="d-cpu-baseline_mlp-w2-2_12_1"' in page  # the details row the heatmap links to
    assert "deployed: mismatch; max abs diff 0.5" in page  # hover title
    assert ".v-patch-needed { background: #ffb74d; }" in page

    csv = read_report_csv(paths["csv"])
    assert list(csv.columns) == list(LONG_COLUMNS) and len(csv) == 3 * 4 + 1
    row = csv[(csv["scenario"] == "unused_params") & (csv["torch"] == "2.13.0") & (csv["device"] == "cpu")].iloc[0]
    assert (row["vanilla"], row["patched"], row["verdict"]) == ("pass", "", "not run")


def test_reference_adjustments_are_visible_everywhere_with_the_variants_they_apply_to(tmp_path: Path) -> None:
    quirk = "gloo reduce-scatter AVG sums (torch < 2.9): reference averages over the replicate dim only"
    recs = [record("plain", "vanilla", "2.8.0", "pass", reference_quirks=[quirk]),
            record("plain", "deployed", "2.8.0", "pass")]  # the deployed set's fix makes FSDP2 average
    paths = build_report([write_jsonl(tmp_path / "r.jsonl", recs)], tmp_path / "out")
    shown = f"vanilla: {quirk}".replace("<", "&lt;")  # Markdown shows record text as text
    assert "ok †" in paths["md"].read_text() and f"Reference adjusted on 2.8.0 (1 cells): {shown}" in paths["md"].read_text()
    assert "ok †" in paths["html"].read_text() and quirk.replace("<", "&lt;") in paths["html"].read_text()
    assert read_report_csv(paths["csv"])["reference_adjusted"].tolist() == [f"vanilla: {quirk}"]


def test_findings_and_patch_changes_outside_fsdp_are_caveats(tmp_path: Path) -> None:
    finding = "gloo reduction summed where FSDP2 asks for an average"
    recs = [record("plain", "vanilla", "2.13.0", "pass"),
            record("plain", "deployed", "2.13.0", "mismatch", findings=[finding],
                   patch_changes=["torch.distributed.fsdp.fully_shard", "torch.nn.functional.linear"])]
    paths = build_report([write_jsonl(tmp_path / "r.jsonl", recs)], tmp_path / "out")
    assert f"deployed {finding}" in paths["md"].read_text()  # shortened there: every text in full in the CSV
    caveats = read_report_csv(paths["csv"])["caveats"].tolist()
    assert caveats == [f"deployed {finding}; deployed patch set replaced torch.nn.functional.linear "
                       "(outside torch.distributed)"]


def test_build_tables_without_records_raises(tmp_path: Path) -> None:
    write_jsonl(tmp_path / "bad.jsonl", ["{oops"])
    with pytest.raises(RecordError, match=r"no valid records found .* \(1 malformed lines skipped\)"):
        build_tables([tmp_path])


def test_cli_writes_report(records_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "reports"
    assert cli_main(["report", "--records", str(records_dir / "cpu"), "--records", str(records_dir / "bad.jsonl"),
                     "--out", str(out)]) == 0
    captured = capsys.readouterr()
    assert captured.out.split() == [str(out / "compat.md"), str(out / "compat.html"), str(out / "compat.csv"),
                                    str(out / "compat-patches.csv")]
    assert "skipped 5 malformed lines" in captured.err
    assert "cuda" not in (out / "compat.csv").read_text()


@pytest.mark.parametrize("kind", ["missing path", "empty folder", "only malformed"])
def test_cli_bad_input_exits_2(kind: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    target = tmp_path / "in"
    if kind == "empty folder":
        target.mkdir()
    elif kind == "only malformed":
        write_jsonl(target / "x.jsonl", ["not json"])
    assert cli_main(["report", "--records", str(target), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and err.startswith("error: ")
    assert ("no such file or folder" if kind == "missing path" else "no valid records found") in err
    assert not (tmp_path / "out").exists()


def test_markdown_details_keep_what_needs_reading_and_shorten_texts(tmp_path: Path) -> None:
    long = "RuntimeError: " + "x" * 500
    recs = [record("calm", "vanilla", "2.13.0", "pass"), record("calm", "deployed", "2.13.0", "pass"),
            record("bug", "vanilla", "2.13.0", "error", patches=["unused_param_reduction"], exc_type="RuntimeError",
                   exc_msg=long),
            record("bug", "patched", "2.13.0", "pass", patches=["unused_param_reduction"])]
    out = build_report([write_jsonl(tmp_path / "r.jsonl", recs)], tmp_path / "rep")
    details = out["md"].read_text().split("## Details", 1)[1].split("## Skipped", 1)[0]
    assert "1 of 2 cells" in details
    assert "| bug " in details and "| calm " not in details
    assert "x" * 200 not in details and "vanilla: RuntimeError: RuntimeError: xxx" in details
    csv = out["csv"].read_text()
    assert "calm" in csv and "x" * 120 in csv  # the CSV keeps every cell and a longer text


def test_a_set_that_fails_together_blames_the_partner_broken_on_its_own(tmp_path: Path) -> None:
    from harness.results.tables import build_tables

    def cell(scenario, patches, patched_status):
        bad = {"expected": "pass"} if patched_status != "pass" else {}
        return [record(scenario, "vanilla", "2.13.0", "error", patches=patches, exc_type="RuntimeError", exc_msg="bug"),
                record(scenario, "patched", "2.13.0", patched_status, patches=patches, **bad)]

    recs = [*cell("pair", ["guard", "widen"], "mismatch"), *cell("solo_guard", ["guard"], "pass"),
            *cell("solo_widen", ["widen"], "mismatch")]
    status = build_tables([write_jsonl(tmp_path / "r.jsonl", recs)]).patches.set_index("patch")["status"]
    assert status["widen"] == "broken" and status["guard"] == "needed"

    # with no cell of its own showing a partner broken, the whole set is blamed
    recs = [*cell("pair", ["guard", "widen"], "mismatch"), *cell("solo_guard", ["guard"], "pass")]
    status = build_tables([write_jsonl(tmp_path / "s.jsonl", recs)]).patches.set_index("patch")["status"]
    assert status["widen"] == "broken" and status["guard"] == "broken"


def test_prerelease_columns_are_marked_and_their_source_named(tmp_path: Path) -> None:
    """A pre-release torch (the matrix's pre-release lane) is marked in every column head of its
    device and its source is named; the CSV keeps the plain version; stable columns are unchanged."""
    import pandas as pd

    from harness.results.report import build_report

    source = {"torch_source": "index https://download.pytorch.org/whl/test/cu128; pre-releases allowed"}
    recs = [record("plain", "vanilla", "2.15.0", "pass", device="cuda"),
            record("plain", "vanilla", "2.16.0rc1", "pass", device="cuda"),
            record("plain", "vanilla", "2.15.0", "pass")]
    recs[1]["env"] |= source
    out = build_report([write_jsonl(tmp_path / "r.jsonl", recs)], tmp_path / "out")
    md = out["md"].read_text()
    assert "| 2.16.0rc1 (pre-release) |" in md.replace("   ", " ").replace("  ", " ")
    assert ("- Torch 2.16.0rc1 is a pre-release: its columns judge a candidate, not a release (from index "
            "https://download.pytorch.org/whl/test/cu128; pre-releases allowed).") in md
    assert "2.15.0 (pre-release)" not in md and md.count("is a pre-release") == 1
    assert "2.16.0rc1 (pre-release)" in out["html"].read_text()
    assert sorted(set(pd.read_csv(out["csv"])["torch"])) == ["2.15.0", "2.16.0rc1"]


def test_markdown_and_html_show_the_same_sections_in_the_same_order(records_dir: Path, tmp_path: Path) -> None:
    """One report model (``report.sections``) rendered twice: every heading in both, in one order."""
    from harness.results.report import sections
    from harness.results.tables import build_tables

    paths = build_report([records_dir], tmp_path / "out")
    md = paths["md"].read_text(encoding="utf-8")
    page = paths["html"].read_text(encoding="utf-8")
    md_heads = [(len(h), t) for h, t in re.findall(r"^(##+) (.+)$", md, flags=re.M)]
    html_heads = [(int(n), html.unescape(t)) for n, t in re.findall(r'<h([23]) id="[^"]*">([^<]*)</h[23]>', page)]
    model = [(s.level, s.title) for s in sections(build_tables([records_dir]))]
    assert md_heads == html_heads == model
    assert any(t == "Collective changes between torch versions" for _, t in model)
    assert [t for _, t in model].index("Scenario × torch: cpu") < [t for _, t in model].index("Environment: cpu")
