"""harness.rank.cuts: which savings a process runs without, validated in one line."""

import os
import subprocess
import sys

import pytest

from harness.rank.cuts import CUTS, ENV, parse_off
from tests.support import ROOT


def test_every_cut_is_on_unless_named():
    assert parse_off("") == frozenset()
    assert parse_off(" group_reuse , probe_cache") == {"group_reuse", "probe_cache"}
    assert parse_off("all") == set(CUTS)


def test_an_unknown_cut_is_named():
    with pytest.raises(ValueError, match=r"FSDP_COMPAT_CUTS_OFF: unknown cut\(s\) bogus; known: memory_stamps"):
        parse_off("group_reuse,bogus")


def test_the_run_stops_before_any_launch_with_one_line(tmp_path):
    out = subprocess.run([sys.executable, "-m", "harness", "run", "--scenario", "plain", "--world-size", "1",
                          "--out", str(tmp_path / "r.jsonl")], cwd=ROOT, capture_output=True, text=True, timeout=120,
                         env={**os.environ, ENV: "bogus"})
    assert out.returncode != 0
    assert out.stderr.strip().splitlines() == [
        "error: FSDP_COMPAT_CUTS_OFF: unknown cut(s) bogus; known: memory_stamps, group_reuse, "
        "probe_cache, selective_preload, pin_ranks, gc_freeze, all"]
    assert not (tmp_path / "r.jsonl").exists() or (tmp_path / "r.jsonl").read_text() == ""
