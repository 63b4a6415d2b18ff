"""Record text made safe to show: records come from CI artifacts, pull requests from forks
and third-party patches modules, so no text of theirs may act as markup, script or formula.

- HTML: jinja2 autoescape and pandas ``Styler`` (``escape="html"``) for text; ``html.escape``
  for attribute values Styler writes raw (tooltips); ``safe_id`` for ids and links; and a
  Content-Security-Policy that allows only the page's own stylesheet (by hash) and no script.
- Markdown: ``md_text`` (raw HTML, table pipes, code and link markup, line breaks).
- CSV: cells a spreadsheet would run as a formula (starting with ``=``, ``+``, ``-``, ``@``, tab,
  CR: the OWASP rule) get a leading ``'``; so does a cell that starts with ``'``, which keeps the
  rule reversible. ``read_report_csv`` takes the ``'`` off again: ``harness diff`` reads the
  texts as they were.
- Module names without the machine's paths (``module_label``), and a file an installed package
  holds named from its package on (``portable``: an ImportError quotes the venv's path).
"""

from __future__ import annotations

import base64
import csv
import hashlib
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd

__all__ = ["CSV_TRIGGERS", "content_security_policy", "csv_cell", "csv_value", "md_text", "module_label",
           "portable", "read_report_csv", "safe_id", "write_report_csv"]

CSV_TRIGGERS: tuple[str, ...] = ("=", "+", "-", "@", "\t", "\r")
_QUOTE = "'"

# --------------------------------------------------------------------------- HTML


def _source_hash(text: str) -> str:
    return "'sha256-" + base64.b64encode(hashlib.sha256(text.encode("utf-8")).digest()).decode("ascii") + "'"


def content_security_policy(*, styles: Sequence[str], scripts: Sequence[str] = ()) -> str:
    """Nothing loads from anywhere; only these exact inline ``<style>``/``<script>`` bodies apply."""
    style = " ".join(map(_source_hash, styles)) or "'none'"
    script = " ".join(map(_source_hash, scripts)) or "'none'"
    return (f"default-src 'none'; style-src {style}; script-src {script}; img-src 'none'; "
            "base-uri 'none'; form-action 'none'")


_UNSAFE_ID = re.compile(r"[^A-Za-z0-9_-]")


def safe_id(text: str) -> str:
    """An element id (and ``#`` link) made of ``[A-Za-z0-9_-]``: dots become ``_``; other
    characters too, then a hash of the original keeps ids apart."""
    dotted = text.replace(".", "_")
    if not _UNSAFE_ID.search(dotted):
        return dotted
    return _UNSAFE_ID.sub("_", dotted) + "-" + hashlib.sha256(text.encode("utf-8")).hexdigest()[:10]


# --------------------------------------------------------------------------- Markdown

_BREAKS = re.compile(r"\r\n|[\x00-\x1f\x7f\x85\u2028\u2029\u202a-\u202e\u2066-\u2069]")
_MARKUP = re.compile(r"([\\`|\[\]])")
_LINE_START = ("#", ">", "+", "-", "=", "*")


def md_text(value: Any, *, cell: bool = False) -> str:
    """Record text as Markdown that shows it literally: no raw HTML, no code spans or links,
    no table pipes, no line breaks (nor bidi overrides); unless it is a table ``cell``, no
    block markup at its start either (a heading, a quote, a list)."""
    if value is None or (isinstance(value, float) and value != value):
        return ""
    text = _BREAKS.sub(" ", str(value))
    text = text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    text = _MARKUP.sub(r"\\\1", text)
    return "\\" + text if text.startswith(_LINE_START) and not cell else text


# --------------------------------------------------------------------------- CSV


def csv_cell(value: Any) -> Any:
    """A spreadsheet reads it as text (see the module docstring); other values unchanged."""
    if isinstance(value, str) and value[:1] in (*CSV_TRIGGERS, _QUOTE):
        return _QUOTE + value
    return value


def csv_value(value: Any) -> Any:
    """The inverse of ``csv_cell``."""
    return value[1:] if isinstance(value, str) and value.startswith(_QUOTE) else value


def write_report_csv(frame: pd.DataFrame, path: str | Path, columns: Sequence[str] | None = None) -> None:
    """Every text quoted: a bare CR in a text would otherwise end the row (readers split on it)."""
    frame.map(csv_cell).to_csv(path, index=False, columns=list(columns) if columns is not None else None,
                               quoting=csv.QUOTE_NONNUMERIC)


def read_report_csv(path: str | Path) -> pd.DataFrame:
    """A CSV the report wrote, with its texts as they were before ``csv_cell``."""
    frame = pd.read_csv(path, keep_default_na=False)
    return frame.assign(**{c: frame[c].map(csv_value) for c in frame.columns
                           if not pd.api.types.is_numeric_dtype(frame[c])})


# --------------------------------------------------------------------------- module names

#: what records before schema-2 module ids named: "SPEC [VERSION] (PATH, sha256 HASH)"
_PATH_IN_ID = re.compile(r"\((?:[^(),]*), (sha256 [0-9a-f]+)\)")
_DIRS = re.compile(r"(?:[\w.~+@-]*/)+(?=[\w.+@-])")


def module_label(module_id: str) -> str:
    """The patches module by name, version and content hash, without the folders it was in
    (records written before module ids dropped the path still carry it)."""
    return _DIRS.sub("", _PATH_IN_ID.sub(r"(\1)", module_id))


#: the folders before an installed package: ".../lib/python3.11/site-packages/"
_INSTALLED = re.compile(r"(?:[A-Za-z]:)?[\\/]?(?:[^\s'\"(),:\\/]+[\\/])*(?:site|dist)-packages[\\/]")


def portable(text: str) -> str:
    """``text`` with every path into an installed package named from the package on
    (``/work/x/.nox/v/lib/python3.11/site-packages/torch/a.py`` -> ``torch/a.py``): the same on
    every machine and checkout."""
    return _INSTALLED.sub("", text)
