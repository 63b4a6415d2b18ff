"""What the README, docs/ and the code's own docs name exists: every file path and every
dotted ``harness.``/``scenarios.``/``fsdp_patches.`` name, so a move or a rename cannot leave
a dead pointer behind; and the README stays a user's guide, not a lab notebook."""

import importlib
import re

import pytest

from tests.support import ROOT

DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
CODE = [*sorted(ROOT.glob("harness/**/*.py")), *sorted(ROOT.glob("scenarios/*.py")),
        *sorted(ROOT.glob("fsdp_patches/*.py")), *sorted(ROOT.glob("bench/*.py")), ROOT / "noxfile.py"]
_PATH = re.compile(r"(?<![\w./-])((?:harness|scenarios|tests|bench|fsdp_patches|docs|reports|\.github|\.ci)/[\w./-]*\w)")
_DOTTED = re.compile(r"(?<![\w./-])((?:harness|scenarios|fsdp_patches)(?:\.[A-Za-z_]\w*)+)")


def named_paths(text: str) -> set[str]:
    """Repository paths in ``text``; one followed by ``.{`` names a family of files (``reports/compat.{md,html}``)."""
    return {m.group(1) for m in _PATH.finditer(text) if not text.startswith(".{", m.end())}


def named_objects(text: str) -> set[str]:
    return {m.group(1) for m in _DOTTED.finditer(text)}


def resolves(dotted: str) -> bool:
    """Whether ``dotted`` is a module of the project, or an attribute chain from one."""
    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        try:
            for attr in parts[i:]:
                obj = getattr(obj, attr)
        except AttributeError:
            return False
        return True
    return False


@pytest.mark.parametrize("doc", [*DOCS, *CODE], ids=lambda p: str(p.relative_to(ROOT)))
def test_every_path_named_exists(doc):
    dead = sorted(p for p in named_paths(doc.read_text()) if not (ROOT / p).exists())
    assert dead == [], f"{doc.relative_to(ROOT)} names paths that do not exist: {dead}"


@pytest.mark.parametrize("doc", [*DOCS, *CODE], ids=lambda p: str(p.relative_to(ROOT)))
def test_every_dotted_name_resolves(doc):
    dead = sorted(d for d in named_objects(doc.read_text()) if not resolves(d))
    assert dead == [], f"{doc.relative_to(ROOT)} names what does not exist: {dead}"


def test_a_dead_path_and_a_dead_name_are_found():
    text = "see `harness/verdict.py` and ``harness.peers.shutdown_peer_sockets``; `reports/compat.{md,csv}`"
    assert [p for p in named_paths(text) if not (ROOT / p).exists()] == ["harness/verdict.py"]
    assert [d for d in named_objects(text) if not resolves(d)] == ["harness.peers.shutdown_peer_sockets"]


def test_the_readme_is_a_guide_of_at_most_300_lines():
    text = (ROOT / "README.md").read_text()
    assert text.count("\n") <= 300
    quick = re.split(r"\n##+ ", text.split("## Quick start", 1)[1], maxsplit=1)[0]
    assert quick.count("```bash") == 1 and re.findall(r"^(pip .*)$", quick, re.M) == [
        'pip install "nox[uv]" pyyaml && nox -s matrix   # the main job: every scenario on torch 2.7 … 2.15, CPU/gloo',
        'pip install "nox[uv]" pyyaml && nox -s tests    # the test suite']
