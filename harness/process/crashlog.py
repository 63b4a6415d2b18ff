"""What a launch's log says about how it died: torchrun's failure summary, a signal, a
C++ ``what()`` line, or the last Python exception; and how a rank's exit is worded."""

from __future__ import annotations

import re
from pathlib import Path

from harness.vocabulary import Failure

__all__ = ["crash_cause", "exit_message", "fatal_signal", "last_what", "tail"]

#: the first line Python's faulthandler writes for each fatal signal
_FATAL = {"Aborted": (6, "SIGABRT"), "Segmentation fault": (11, "SIGSEGV"), "Bus error": (7, "SIGBUS"),
          "Floating-point exception": (8, "SIGFPE"), "Floating point exception": (8, "SIGFPE"),
          "Illegal instruction": (4, "SIGILL")}

_SIGNAL = re.compile(r"Signal (\d+) \((\w+)\) received by PID")
_EXITCODE = re.compile(r"exitcode\s*:\s*(-?\d+)")
_RANK = re.compile(r"rank\s*:\s*(\d+) \(local_rank")
_WHAT = re.compile(r"what\(\):\s*(.+)")


def crash_cause(log_path: Path) -> tuple[str, str, int | None]:
    """(exception type, first line, rank) from torchrun's failure summary or the last error."""
    text = log_path.read_text(errors="replace") if log_path.exists() else ""
    root = text[text.find("Root Cause") :] if "Root Cause" in text else text
    rank_m = _RANK.search(root)
    rank = int(rank_m.group(1)) if rank_m else None
    sig = _SIGNAL.search(root)
    if sig:
        what = _last_what_in(text)  # the C++ exception that ended the process (gloo enforce, ...)
        detail = f": {what}" if what else ""
        return Failure.SIGNAL, f"rank {rank} died: signal {sig.group(1)} ({sig.group(2)}){detail}", rank
    errors = [
        ln for ln in text.splitlines() if re.search(r"\b\w+(Error|Exception)\b: ", ln) and "ChildFailedError" not in ln
    ]
    if errors:
        line = re.sub(r"^(\[rank\d+\]:\s*)+", "", errors[-1]).strip()
        return line.split(":", 1)[0], line[:500], rank
    code = _EXITCODE.search(root)
    if code:
        return Failure.EXIT_CODE, f"rank {rank} exited with code {code.group(1)}", rank
    return Failure.LAUNCH_ERROR, "launch ended without a result (see log)", rank


def exit_message(rank: int | None, code: int, phase: str | None) -> str:
    """``rank 0 exited with code 0 during install of patch X`` (``harness.protocol.phase_words``)."""
    from harness.protocol import phase_words

    return f"rank {rank} exited with code {code} {phase_words(phase)}"


def tail(path: Path, n: int) -> str:
    if not path.exists():
        return ""
    return "\n".join(path.read_text(errors="replace").splitlines()[-n:])


def fatal_signal(crash_file: Path, log_path: Path, rank: int) -> tuple[str, str] | None:
    """(exception type, first line) when ``crash_file`` holds the faulthandler report of a
    rank killed by a fatal signal, else None. The C++ ``what()`` line comes from the log."""
    try:
        report = crash_file.read_text(errors="replace")
    except OSError:
        return None
    fatal = next((v for k, v in _FATAL.items() if f"Fatal Python error: {k}" in report), None)
    if fatal is None:
        return None
    what = last_what(log_path)
    detail = f": {what}" if what else ""
    return Failure.SIGNAL, f"rank {rank} died: signal {fatal[0]} ({fatal[1]}){detail}"


def last_what(log_path: Path) -> str | None:
    """The last C++ ``what()`` line of a log (the exception that aborted a process; an
    earlier one belongs to a forked cell that aborted before)."""
    return _last_what_in(log_path.read_text(errors="replace") if log_path.exists() else "")


def _last_what_in(text: str) -> str | None:
    found = _WHAT.findall(text)
    return found[-1].strip()[:400] if found else None
