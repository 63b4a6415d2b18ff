"""python -m harness diff: what changed between two runs, and whether anything got worse."""



import pytest

from harness.cli import main as cli_main
from harness.results.diff import diff_runs, load_side, same_error
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



# --------------------------------------------------------------------------- error texts compared as errors

#: texts as reports/compat.csv holds them (first lines, cut at 200 characters)
SET_A = "AssertionError: FSDP reduce-scatter expects uniform gradient dtype but got {torch.bfloat16, torch.float32}"
SET_B = "AssertionError: FSDP reduce-scatter expects uniform gradient dtype but got {torch.float32, torch.bfloat16}"
ABORT = ("Signal: rank {r} died: signal 6 (SIGABRT): [enforce fail at {root}third_party/gloo/gloo/transport/tcp/"
         "pair.cc:{line}] op.preamble.length <= op.nbytes. 96 vs 32")
TIMEOUT = ("CellTimeout: no result within 3 s: rank(s) [{late}] did not arrive ({first}; {second})")
LOST = "rank {r} lost its peers during 'step 0 micro-batch 1 forward'"
WAITED = "rank {r} waited in a collective in all_reduce (distributed_c10d.py:3181) during 'step 0 micro-batch 1 forward'"


def _cut(text: str) -> str:
    from harness.results.tables import _first_line

    return _first_line(text)


SAME = [
    (SET_A, SET_B),
    (ABORT.format(r=1, root="/pytorch/", line=456), ABORT.format(r=3, root="/pytorch/", line=456)),
    (ABORT.format(r=1, root="/__w/pytorch/pytorch/", line=464), ABORT.format(r=0, root="/pytorch/", line=456)),
    # which rank died first: the clauses per rank swap places, and the text is cut at 200 characters
    (TIMEOUT.format(late=0, first=LOST.format(r=0), second=WAITED.format(r=1)),
     TIMEOUT.format(late=1, first=WAITED.format(r=0), second=LOST.format(r=1))),
    (_cut(TIMEOUT.format(late=0, first=LOST.format(r=0), second=WAITED.format(r=1))),
     _cut(TIMEOUT.format(late=1, first=WAITED.format(r=0), second=LOST.format(r=1)))),
    (_cut(TIMEOUT.format(late=0, first=LOST.format(r=0), second=WAITED.format(r=1))),
     TIMEOUT.format(late=1, first=WAITED.format(r=0), second=LOST.format(r=1))),
    ("RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer [127.0.0.1]:41234",
     "RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer [10.1.2.3]:5555"),
    ("RuntimeError: tensor at 0x7f3a2b1c0040 freed (pid 4242)", "RuntimeError: tensor at 0x55d01234 freed (pid 77)"),
    ("FileNotFoundError: /tmp/tmpab12cd34/store/rank0.json", "FileNotFoundError: /tmp/pytest-of-ci/tmpzz9q81xx/store/rank0.json"),
    ("[rank1]: RuntimeError: boom", "[rank0]: RuntimeError: boom"),
    # the committed report against a fresh run: the crash line with and without C++'s terminate prefix
    ("Signal: rank 3 died: signal 6 (SIGABRT): [enforce fail at /pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:456]"
     " op.preamble.length <= op.nbytes. 48 vs 16. Received data size doesn't match expected size. …",
     "Signal: rank 3 died: signal 6 (SIGABRT): what():  [enforce fail at /pytorch/third_party/gloo/gloo/transport/tcp/"
     "pair.cc:456] op.preamble.length <= op.nbytes. 48 vs 16. Received data size doesn't match expect…"),
]
DIFFERENT = [
    (SET_A, SET_A.replace("torch.bfloat16", "torch.float16")),
    ("RuntimeError: Cannot use ReduceOp.AVG with Gloo", "ValueError: Cannot use ReduceOp.AVG with Gloo"),
    ("RuntimeError: The size of tensor a (50) must match the size of tensor b (86) at non-singleton dimension 0",
     "RuntimeError: The size of tensor a (86) must match the size of tensor b (50) at non-singleton dimension 0"),
    ("RuntimeError: _foreach_norm cannot compute the infinity norm on an empty tensor because the operation does not "
     "have an identity", "RuntimeError: linalg.vector_norm cannot compute the inf norm on an empty tensor because the "
     "operation does not have an identity"),
    (ABORT.format(r=1, root="/pytorch/", line=456), ABORT.format(r=1, root="/pytorch/", line=456).replace("96 vs 32",
                                                                                                        "48 vs 16")),
    (TIMEOUT.format(late=0, first=LOST.format(r=0), second=WAITED.format(r=1)),
     TIMEOUT.format(late=0, first=LOST.format(r=0), second=WAITED.format(r=1).replace("all_reduce", "all_gather"))),
    (TIMEOUT.format(late=0, first=LOST.format(r=0), second=WAITED.format(r=1)),
     TIMEOUT.format(late=0, first=LOST.format(r=0), second=LOST.format(r=1))),
    (_cut(ABORT.format(r=1, root="/pytorch/", line=456) + ". " + "x" * 200),
     _cut(ABORT.format(r=1, root="/pytorch/", line=456).replace("96", "97") + ". " + "x" * 200)),
    ("AttributeError: 'FSDPParam' object has no attribute '_unsharded_param'",
     "AttributeError: 'FSDPParam' object has no attribute '_sharded_param'"),
]


@pytest.mark.parametrize(("a", "b"), SAME)
def test_the_same_error_from_another_run_is_the_same(a, b):
    assert a != b and same_error(a, b) and same_error(b, a)


@pytest.mark.parametrize(("a", "b"), DIFFERENT)
def test_a_real_change_stays_a_change(a, b):
    assert not same_error(a, b) and not same_error(b, a)


def test_diff_lists_only_real_text_changes_and_shows_the_texts_as_they_were(tmp_path):
    old = _run(tmp_path, "old", [*_cell("2.12.1", "error", msg=SET_A), *_cell("2.13.0", "error", msg="boom (pid 12)"),
                                 *_cell("2.14.1", "error", msg="boom")])
    new = _run(tmp_path, "new", [*_cell("2.12.1", "error", msg=SET_B), *_cell("2.13.0", "error", msg="boom (pid 98)"),
                                 *_cell("2.14.1", "error", msg="bang")])
    d = diff_runs(load_side(old), load_side(new))
    assert d.texts == ["s w2 on 2.14.1 (cpu): 'RuntimeError: boom' → 'RuntimeError: bang'"]


def test_the_prerelease_lane_compares_the_newest_stable_release_with_each_candidate(tmp_path, capsys):
    from harness.results.diff import prerelease_lane

    stable = _run(tmp_path, "stable", [*_cell("2.14.1", "error"), *_cell("2.15.0", "error")])
    assert prerelease_lane([stable]).markdown() == ""
    assert cli_main(["prerelease", "--records", str(stable)]) == 0 and capsys.readouterr().out == ""
    records = _run(tmp_path, "lane", [*_cell("2.14.1", "error"), *_cell("2.15.0", "error"),
                                      *_cell("2.16.0rc1", "pass"), *_cell("2.17.0.dev20261201", "error", "mismatch"),
                                      *_cell("2.16.0rc1", "error", scenario="t")])
    lane = prerelease_lane([records])
    titles = [d.markdown().splitlines()[0] for d in lane.diffs]
    assert titles == ["## Changes: newest stable release on cpu (torch 2.15.0) → pre-release on cpu (torch 2.16.0rc1)",
                      "## Changes: newest stable release on cpu (torch 2.15.0) → pre-release on cpu "
                      "(torch 2.17.0.dev20261201)"]
    assert lane.diffs[0].fixed_upstream == [
        "s w2 on torch 2.15.0 → 2.16.0rc1 (cpu): patch needed → fixed upstream (vanilla pass, patched pass)"]
    assert lane.diffs[0].added and not lane.diffs[0].got_worse and lane.diffs[1].got_worse
    out = tmp_path / "lane.md"
    assert cli_main(["prerelease", "--records", str(records), "--out", str(out)]) == 1
    assert capsys.readouterr().out == out.read_text() and out.read_text().startswith("# Pre-release lane\n")
    alone = _run(tmp_path, "alone", _cell("2.16.0rc1", "pass"))
    assert prerelease_lane([alone]).alone == ["2.16.0rc1 (cpu)"]
