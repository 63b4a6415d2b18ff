"""What a judging rank hands its referee: any picklable object whose CPU tensors travel in one flat buffer.

``torch.save`` writes each tensor's storage as a record of its own in a zip archive and ``torch.load`` reads them
back one by one; a cell's snapshots hold hundreds of small tensors (every param's grad, clipped grad and post-step
value, per step), so the archive's bookkeeping was most of the hand-off (a 180-tensor snapshot list: 3.5 ms to
save and 4.6 ms to load, against 0.9 and 0.6 ms this way, measured side by side). Here the object is pickled with
each plain CPU tensor replaced by its index (``persistent_id``), and the tensors' bytes follow the pickle, each
starting on a 64-byte boundary, so loading makes every tensor a view of one buffer read in one call. A tensor held
twice comes back as one tensor; anything else (a tensor subclass, one that requires grad, one on another device,
a sparse or quantized one) is pickled as torch pickles it.

Layout: 8 bytes (little-endian) giving the header's length, the header (a pickle of the object's pickle, each
tensor's dtype, shape, offset and byte count, and the tensors' bytes in all), zero padding to 64 bytes, then the
tensors' bytes.
"""

from __future__ import annotations

import io
import os
import pickle
from typing import Any

import torch

__all__ = ["load", "save"]

_ALIGN = 64


class _Saver(pickle.Pickler):
    def __init__(self, file: io.BytesIO) -> None:
        super().__init__(file, protocol=5)
        self.tensors: list[torch.Tensor] = []
        self.index: dict[int, int] = {}

    def persistent_id(self, obj: Any) -> int | None:
        if type(obj) is not torch.Tensor or obj.device.type != "cpu" or obj.requires_grad \
                or obj.layout is not torch.strided or obj.is_quantized:
            return None
        if id(obj) not in self.index:
            self.index[id(obj)] = len(self.tensors)
            self.tensors.append(obj)
        return self.index[id(obj)]


class _Loader(pickle.Unpickler):
    def __init__(self, file: io.BytesIO, tensors: list[torch.Tensor]) -> None:
        super().__init__(file)
        self.tensors = tensors

    def persistent_load(self, pid: int) -> torch.Tensor:
        return self.tensors[pid]


def save(obj: Any, path: str | os.PathLike) -> None:
    body = io.BytesIO()
    saver = _Saver(body)
    saver.dump(obj)
    meta, blobs, start = [], [], 0
    for t in saver.tensors:
        flat = t.detach().resolve_conj().resolve_neg().contiguous().reshape(-1).view(torch.uint8)
        meta.append((t.dtype, tuple(t.shape), start, flat.numel()))
        pad = -flat.numel() % _ALIGN
        blobs += [flat, torch.zeros(pad, dtype=torch.uint8)] if pad else [flat]
        start += flat.numel() + pad
    header = pickle.dumps((body.getvalue(), meta, start), protocol=5)
    with open(path, "wb") as f:
        f.write(len(header).to_bytes(8, "little"))
        f.write(header)
        f.write(b"\0" * (-(8 + len(header)) % _ALIGN))
        if start:
            f.write(torch.cat(blobs).numpy().data)


def load(path: str | os.PathLike, *, copies: bool = False) -> Any:
    """The object ``save`` wrote; its tensors are views of one buffer, or (``copies``) each a tensor
    of its own, as ``torch.save`` needs them (it refuses views of one storage as different dtypes)."""
    with open(path, "rb") as f:
        size = int.from_bytes(f.read(8), "little")
        body, meta, total = pickle.loads(f.read(size))
        f.read(-(8 + size) % _ALIGN)
        data = bytearray(total)
        if f.readinto(data) != total:
            raise ValueError(f"{path}: shorter than the {total} bytes of tensors its header names")
    buffer = torch.frombuffer(data, dtype=torch.uint8) if data else torch.empty(0, dtype=torch.uint8)
    tensors = [buffer[start:start + n].view(dtype).reshape(shape) if n else torch.empty(shape, dtype=dtype)
               for dtype, shape, start, n in meta]
    if copies:
        tensors = [t.clone() for t in tensors]
    return _Loader(io.BytesIO(body), tensors).load()
