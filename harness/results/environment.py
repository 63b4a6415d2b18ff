"""The report's environment table: per device and torch, what the cells ran on (torch build,
python, device, backend, host, machine, CPU model and the kernel set torch chose for it, the
intra-op threads, dates, the torch source), from the ``env`` every record carries
(``harness.results.machine``), and how many cells were reused from an earlier run with the
dates they were measured (``harness.launch.incremental``)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import pandas as pd

__all__ = ["ENV_FIELDS", "ENV_LABELS", "environment_table"]

ENV_FIELDS: tuple[str, ...] = ("python", "torch", "torch_build", "gpu", "host", "platform", "cpus", "torch_source",
                               "cpu_model", "cpu_capability", "threads")
ENV_LABELS: tuple[str, ...] = ("torch build", "python", "device name", "backend", "host", "machine", "CPU", "CPU kernels",
                               "date", "torch source", "reused cells")


def _joined(values: Iterable[Any]) -> str:
    return ", ".join(sorted({str(v) for v in values if v == v and v is not None and v != ""}))


def _reused(group: pd.DataFrame) -> str:
    """"N of M, measured DATE – DATE" for cells answered by an earlier run's record."""
    if "reused_from" not in group:
        return ""
    origins = [r for r in group["reused_from"] if isinstance(r, dict)]
    if not origins:
        return ""
    return f"{len(origins)} of {len(group)}, measured {_date_range(r.get('started_at') for r in origins)}"


def _date_range(stamps: Iterable[str]) -> str:
    days = sorted({s[:10] for s in stamps if isinstance(s, str) and s})
    return "" if not days else days[0] if days[0] == days[-1] else f"{days[0]} – {days[-1]}"


def environment_table(latest: pd.DataFrame) -> pd.DataFrame:
    """Rows: device, torch, then one column per environment item."""
    rows = []
    for (device, torch), g in latest.groupby(["device", "torch"], sort=False):
        machines = [" ".join(str(x) for x in (p, f"{int(c)} CPUs" if c == c and c is not None else None) if x)
                    for p, c in zip(g["env_platform"], g["env_cpus"])]
        kernels = [" ".join(str(x) for x in (isa, f"{int(t)} intra-op threads" if t == t and t is not None else None) if x)
                   for isa, t in zip(g["env_cpu_capability"], g["env_threads"])]
        rows.append({"device": device, "torch": torch, "torch build": _joined(g["env_torch"]),
                     "python": _joined(g["env_python"]),
                     "device name": _joined(gpu if gpu else dev for gpu, dev in zip(g["env_gpu"], g["device"])),
                     "backend": _joined(g["backend"]), "host": _joined(g["env_host"]), "machine": _joined(machines),
                     "CPU": _joined(g["env_cpu_model"]), "CPU kernels": _joined(kernels),
                     "date": _date_range(g["started_at"]), "torch source": _joined(g["env_torch_source"]),
                     "reused cells": _reused(g)})
    return pd.DataFrame(rows, columns=["device", "torch", *ENV_LABELS])
