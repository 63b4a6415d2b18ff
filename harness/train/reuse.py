"""A reference computed once per launch for every cell that would compute the same one.

A cell's reference is a function of its scenario (as built for the cell: meta init, the
``api`` variant's recipe), the world size, the quirks it models and the tensors of FSDP2's
run that it is fed: each step's params and the grads the optimizer stepped with
(``harness.train.reference``). Cells whose FSDP2 side produced those tensors bit for bit
(a scenario's vanilla, patched and deployed cells where the patches leave its path alone)
get the same reference; the first computes it and leaves it in the launch folder, keyed by
a hash of all of that, and the others read it (12 of 33 judged cells in a five-scenario
sample on 2.13).

A reference is also kept for later runs (``References.kept``, beside the records' launches),
keyed by the same hash and everything else it depends on (the cell's ``reference_inputs``:
the torch build, the machine, the environment, the harness's code, the installs, the
scenario's files): a cell that reruns because the patch code it ran changed, and that
produced the same tensors, reads the reference instead of computing it again. Its patches
are not among them: the referee never runs under them. A run that runs everything
(``--fresh``, ``--shuffle``, ``--dump``) leaves references there and reads none.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch

from harness.train.step import StepTensors

__all__ = ["FROM_EARLIER_RUN", "FROM_LAUNCH", "References", "reference_key", "reused"]


def _feed(h: "hashlib._Hash", tensors: dict[str, torch.Tensor | None]) -> None:
    for name in sorted(tensors):
        t = tensors[name]
        h.update(f"{name}|".encode())
        if t is None:
            h.update(b"None;")
            continue
        t = t.detach().cpu().contiguous()
        h.update(f"{t.dtype}{tuple(t.shape)};".encode())
        if t.numel():
            h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())


def reference_key(what: str, observed: list[StepTensors]) -> str:
    """A hash of ``what`` (scenario, variant recipe, world size, quirks: the caller's words)
    and every param, grad and clipped grad of ``observed``."""
    h = hashlib.blake2b(digest_size=20)
    h.update(f"{what}|{len(observed)}|".encode())
    for snap in observed:
        h.update(f"step {snap.step}|".encode())
        for part in (snap.params, snap.grads, snap.clipped):
            _feed(h, part)
    return h.hexdigest()


@dataclass(kw_only=True)
class References:
    """Where a referee finds references and leaves those it computes."""

    #: this launch's (``LaunchPlan.references_folder``): read and written
    launch: Path
    #: kept across runs (the launch folder's ``KEPT_REFERENCES``): written; read unless ``read_kept`` is False
    kept: Path | None = None
    #: False where the run runs everything (``--fresh``): a reference of an earlier run is not read
    read_kept: bool = True


def _load(path: Path) -> list[StepTensors] | None:
    """The reference in ``path``; None where there is none or the file is not one (torch.load
    raises ``pickle.UnpicklingError`` on such): then it is computed again."""
    try:
        return [StepTensors(**d) for d in torch.load(path, weights_only=False)]
    except Exception:  # noqa: BLE001 - whatever the file holds, it is not a reference to trust
        return None


def _save(reference: list[StepTensors], folder: Path, name: str) -> Path:
    """Written whole, then renamed: a reader of another process reads all of it or none."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    torch.save([s.__dict__ for s in reference], tmp)
    os.replace(tmp, path)
    return path


def _link(src: Path, folder: Path, name: str) -> None:
    """``src`` as ``folder / name`` too: a hard link where the file system allows, else a copy."""
    folder.mkdir(parents=True, exist_ok=True)
    tmp = folder / f"{name}.{os.getpid()}.tmp"
    try:
        os.link(src, tmp)
    except OSError:
        shutil.copyfile(src, tmp)
    os.replace(tmp, folder / name)


#: where a reused reference came from (the record's ``reference_from``)
FROM_LAUNCH, FROM_EARLIER_RUN = "this launch", "an earlier run"


def reused(where: References | None, key: str,
           compute: Callable[[], list[StepTensors]]) -> tuple[list[StepTensors], str | None]:
    """The reference under ``key`` in this launch's folder, else (where it may be read) the kept
    one, else ``compute()`` left in both; where it came from (``FROM_LAUNCH``, ``FROM_EARLIER_RUN``;
    None: computed). Without ``where``: ``compute()``."""
    if where is None:
        return compute(), None
    name = f"{key}.pt"
    if (found := _load(where.launch / name)) is not None:
        return found, FROM_LAUNCH
    if where.kept is not None and where.read_kept and (found := _load(where.kept / name)) is not None:
        # its age says when it was last used (harness.launch.outpath); a copy for this launch's later
        # cells: neither is this cell's business if it fails (another run's start pruned it meanwhile)
        with contextlib.suppress(OSError):
            os.utime(where.kept / name)
            _link(where.kept / name, where.launch, name)
        return found, FROM_EARLIER_RUN
    reference = compute()
    if where.kept is not None:
        with contextlib.suppress(OSError):  # kept for later runs; a full or read-only disk: this launch only
            _link(_save(reference, where.kept, name), where.launch, name)
            return reference, None
    _save(reference, where.launch, name)
    return reference, None
