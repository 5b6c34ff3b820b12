"""The library's checkpoint directory (docs/checkpoint.md) as torch tensors and back.

:func:`read` turns a checkpoint that ``muon_optimizer_save`` wrote at any data-parallel size
into one fp32 tensor per param and state kind, in the param's global coordinates (its
registered shape), plus the model description of its ``index.json``. :func:`write` writes
such tensors back as a checkpoint of one rank file (dp 1), which ``muon_optimizer_load``
reads at any data-parallel size. Both follow the format of docs/checkpoint.md: ``index.json``
is an envelope whose ``crc32`` covers the exact bytes of its ``index`` value, rank files are
safetensors files of F32 tensors keyed ``{component}/{kind}@{start}:{end}`` with the CRC-32 of
every tensor in the header's ``__metadata__``.
"""

import json
import math
import os
import zlib
from pathlib import Path

import torch

FORMAT = "muon_opt.checkpoint"
RANK_FILE = "rank-00000.safetensors"
# The state kinds of each route, in the library's order (src/checkpoint/components.rs).
KINDS = {"muon": ("master", "momentum"), "adamw": ("master", "exp_avg", "exp_avg_sq")}


def _crc(data):
    return f"{zlib.crc32(data) & 0xFFFFFFFF:08x}"


class _RankFile:
    """One safetensors rank file, read whole (8-byte header length, JSON header, data)."""

    def __init__(self, path):
        raw = Path(path).read_bytes()
        length = int.from_bytes(raw[:8], "little")
        self.header = json.loads(raw[8 : 8 + length])
        self.data = bytearray(raw[8 + length :])
        self.path = path

    def tensor(self, key):
        info = self.header.get(key)
        if info is None or info.get("dtype") != "F32":
            raise ValueError(f"{self.path}: no F32 tensor '{key}' (the index names it)")
        start, end = info["data_offsets"]
        return torch.frombuffer(self.data, dtype=torch.float32, offset=start, count=(end - start) // 4).clone()


def read(directory):
    """(model, state): ``model`` is the checkpoint's index without its per-rank parts (files,
    pieces, dp); ``state[name][kind]`` the param's fp32 state in its registered shape."""
    directory = Path(directory)
    envelope = json.loads((directory / "index.json").read_text())
    index = envelope["index"]
    if "tp" in index:
        raise ValueError(f"{directory}: a checkpoint of tensor-parallel shards has no single global state to read")
    files = {f["name"]: _RankFile(directory / f["name"]) for f in index["files"]}
    state = {}
    for param in index["params"]:
        numel = math.prod(param["shape"])
        flat = {kind: torch.empty(numel, dtype=torch.float32) for kind in KINDS[param["route"]]}
        for component in param["components"]:
            base = component["offset"]
            for piece in component["pieces"]:
                for kind, key in piece["keys"].items():
                    flat[kind][base + piece["start"] : base + piece["end"]] = files[piece["file"]].tensor(key).reshape(-1)
        state[param["name"]] = {kind: values.view(param["shape"]) for kind, values in flat.items()}
    model = {key: value for key, value in index.items() if key not in ("files", "dp")}
    model["params"] = [
        dict(param, components=[{k: v for k, v in c.items() if k != "pieces"} for c in param["components"]])
        for param in index["params"]
    ]
    return model, state


def write(directory, model, state):
    """Writes ``state`` (as :func:`read` returns it) for ``model`` into the new directory
    ``directory`` as a dp-1 checkpoint."""
    directory = Path(directory)
    directory.mkdir()
    tensors, params = {}, []
    for param in model["params"]:
        values = state[param["name"]]
        for kind in KINDS[param["route"]]:
            got = values.get(kind) if isinstance(values, dict) else None
            if not isinstance(got, torch.Tensor) or got.numel() != math.prod(param["shape"]):
                raise ValueError(
                    f"load_state_dict: param '{param['name']}' needs '{kind}', a tensor of shape {param['shape']}, "
                    f"got {got if got is None else tuple(getattr(got, 'shape', ()))}"
                )
        components = []
        for component in param["components"]:
            numel = math.prod(component["shape"])
            keys = {}
            for kind in KINDS[param["route"]]:
                key = f"{component['name']}/{kind}@0:{numel}"
                flat = values[kind].reshape(-1)[component["offset"] : component["offset"] + numel]
                tensors[key] = (component["shape"], flat.to(torch.float32).contiguous().numpy().tobytes())
                keys[kind] = key
            components.append(dict(component, pieces=[{"file": RANK_FILE, "start": 0, "end": numel, "keys": keys}]))
        params.append(dict(param, components=components))
    header_bytes, crc, size, header_crc = _write_rank_file(directory / RANK_FILE, tensors)
    files = [{"name": RANK_FILE, "rank": 0, "bytes": size, "crc32": crc, "header_bytes": header_bytes,
              "header_crc32": header_crc}]
    index = dict(model, dp=1, files=files, params=params)
    body = json.dumps(index)
    envelope = '{"format":"%s","format_version":1,"crc32":"%s","index":%s}\n' % (FORMAT, _crc(body.encode()), body)
    _write_synced(directory / "index.json", envelope.encode())


def _write_rank_file(path, tensors):
    """A safetensors file of ``tensors`` (key -> (shape, little-endian f32 bytes)) in key order,
    the CRC-32 of each under its key in ``__metadata__``; returns (header bytes, file CRC-32,
    file bytes, header CRC-32) as index.json records them."""
    metadata = {key: _crc(data) for key, (_, data) in tensors.items()}
    metadata.update(format=FORMAT, rank="0", dp="1")
    header, offset = {"__metadata__": metadata}, 0
    for key in sorted(tensors):
        shape, data = tensors[key]
        header[key] = {"dtype": "F32", "shape": list(shape), "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
    text = json.dumps(header, sort_keys=True, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)  # safetensors aligns the data to 8 bytes
    head = len(text).to_bytes(8, "little") + text
    whole = head + b"".join(tensors[key][1] for key in sorted(tensors))
    _write_synced(path, whole)
    return len(head), _crc(whole), len(whole), _crc(head)


def _write_synced(path, data):
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
