"""python -m harness diff: what changed between two runs, and whether anything got worse."""



import pytest

from harness.cli import main as cli_main
from harness.results.diff import diff_runs, load_side
from harness.results.report import build_report
from tests.test_report import record, write_jsonl

A = "unused_param_reduction"


def _run(tmp_path, name, recs):
    return write_jsonl(tmp_path / name / "r.jsonl", recs).parent


def _cell(torch, vanilla, patched="pass", *, scenario="s", ws=2, **extra):
    v = record(scenario, "vanilla", torch, vanilla, patches=[A], world_size=ws,
               **({"exc_type": "RuntimeError", "exc_msg": extra.pop("msg", "boom")} if vanilla != "pass" else {}))
    p = record(scenario, "patched", torch, patched, patches=[A], world_size=ws,
               **({"expected": "pass", "as_expected": False, "exc_msg": "broken"} if patched != "pass" else {}))
    return [v, p]


def test_worse_better_fixed_upstream_added_and_gone(tmp_path):
    old = _run(tmp_path, "old", [*_cell("2.13.0", "error"), *_cell("2.14.1", "error"),
                                 *_cell("2.14.1", "error", scenario="gone"), *_cell("2.12.1", "error", ws=4)])
    new = _run(tmp_path, "new", [*_cell("2.13.0", "error", "mismatch"), *_cell("2.14.1", "pass"),
                                 *_cell("2.12.1", "error", ws=4, msg="another message"),
                                 *_cell("2.15.0", "pass", scenario="added")])
    d = diff_runs(load_side(old), load_side(new))
    assert d.worse == ["s w2 on 2.13.0 (cpu): patch needed → patch broken (vanilla error, patched mismatch): "
                       "patched regression: mismatch, expected pass"]
    assert d.fixed_upstream == ["s w2 on 2.14.1 (cpu): patch needed → fixed upstream (vanilla pass, patched pass)"]
    assert d.gone == ["gone w2 on 2.14.1 (cpu): was patch needed"]
    assert d.added == ["added w2 on 2.15.0 (cpu): fixed upstream (vanilla pass, patched pass)"]
    assert d.texts == ["s w4 on 2.12.1 (cpu): 'RuntimeError: boom' → 'RuntimeError: another message'"]
    assert any(p.startswith(f"{A} on 2.13.0 (cpu): needed → broken") for p in d.patches_worse)
    assert d.got_worse
    md = d.markdown()
    assert md.index("### Got worse") < md.index("### Newly fixed upstream")


def test_the_same_run_is_no_change_and_exit_0(tmp_path, capsys):
    recs = [*_cell("2.13.0", "error"), *_cell("2.14.1", "pass")]
    old, new = _run(tmp_path, "old", recs), _run(tmp_path, "new", recs)
    assert cli_main(["diff", str(old), str(new)]) == 0
    assert "No change." in capsys.readouterr().out


def test_csvs_with_their_patch_tables_and_an_upgrade_diff(tmp_path, capsys):
    a = build_report([_run(tmp_path, "a", _cell("2.14.1", "error"))], tmp_path / "ra")
    b = build_report([_run(tmp_path, "b", _cell("2.15.0", "pass"))], tmp_path / "rb")
    out = tmp_path / "diff.md"
    assert cli_main(["diff", str(a["csv"]), str(b["csv"]), "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert text == out.read_text()
    assert "s w2 on torch 2.14.1 → 2.15.0 (cpu): patch needed → fixed upstream" in text
    assert f"{A} on torch 2.14.1 → 2.15.0 (cpu): needed → retire" in text


def test_an_old_records_file_against_a_new_one_exits_1_when_worse(tmp_path):
    old = _run(tmp_path, "old", _cell("2.13.0", "error"))
    new = _run(tmp_path, "new", _cell("2.13.0", "error", "hang"))
    assert cli_main(["diff", str(old), str(new)]) == 1


@pytest.mark.parametrize("bad", ["missing.csv", "nothing_here"])
def test_bad_input_is_one_line_and_exit_2(tmp_path, capsys, bad):
    good = _run(tmp_path, "good", _cell("2.13.0", "error"))
    assert cli_main(["diff", str(tmp_path / bad), str(good)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("error: ")


def test_a_csv_that_is_not_a_report_is_named(tmp_path, capsys):
    (tmp_path / "x.csv").write_text("a,b\n1,2\n")
    assert cli_main(["diff", str(tmp_path / "x.csv"), str(tmp_path / "x.csv")]) == 2
    assert "not a compat.csv (no column 'device')" in capsys.readouterr().err

