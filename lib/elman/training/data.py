"""Byte corpora and the training loader (`elman data`). Chapter: book/chapters/training_protocol.ipynb.

Two corpora are built by name. The default, `debian-mix` (`corpus.py`), is a capped,
cleaned and deduplicated mix of code bases and prose from Debian packages, split by
document and stratified by source. `linux-6.1` is the Linux 6.1 source tree from Debian's
package `linux-source-6.1`: every file of the tree that is text (valid UTF-8, no NUL and
no 0x1E byte) is one document, in a seeded shuffled order, the last 1 % of documents held
out. Both join documents by the byte 0x1E (ASCII record separator), put the validation
documents after the training ones and write a JSON manifest beside the text
(`<file>.json`) with the packages, versions and sha256s, the corpus sha256, sizes and
where the validation split starts (and, for the mix, each source's validation byte range).

Subsets keep that layout: a prefix of the training documents and of each source's
validation documents (`subset`). `pack` writes one as xz to carry to a GPU host, in parts
of at most `--part-mb` when asked; `unpack` (or `ByteData` given a `.xz` file) restores
it. The committed test slice in `tests/data/` is such a subset.

The loader (`ByteData`, `Batches`) memory-maps any raw byte file and draws i.i.d.
training windows of T+1 bytes. Window positions come from a counter-based generator keyed
by (seed, rank, step): resuming at step k draws exactly the windows of step k without
replaying, each DDP rank has its own stream, and every model trained with the same seed,
batch and T sees the same windows in the same order. Validation tiles the held-out split
with windows of T+1 bytes at a stride of T, so every held-out byte after the first is
predicted exactly once (`val_positions`); an evaluation on fewer windows takes evenly
spaced tiles, the same for every model. A file without a manifest holds out its last 1 %
of bytes for validation.
"""
from __future__ import annotations

import argparse
import hashlib
import io
import json
import lzma
import os
import shutil
import subprocess
import tarfile
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Callable, Iterator

import numpy as np
import torch
from tqdm import tqdm

from ..core.records import ROOT
from . import cleaning

SEP = 0x1E
PACKAGE = "linux-source-6.1"
TARBALL = "usr/src/linux-source-6.1.tar.xz"
CORPUS_NAME = "linux-6.1"
MIX_NAME = "debian-mix"
CORPORA = {MIX_NAME: ROOT / "data" / f"{MIX_NAME}.txt", CORPUS_NAME: ROOT / "data" / f"{CORPUS_NAME}.txt"}
DEFAULT_DATA = CORPORA[MIX_NAME]
CACHE = ROOT / ".cache" / "data"
TEST_SLICE = ROOT / "tests" / "data" / f"{CORPUS_NAME}-slice.txt"
MIX_SLICE = ROOT / "tests" / "data" / f"{MIX_NAME}-slice.txt"
XZ_BLOCK = 64 << 20  # bytes of text per xz stream of a packed corpus (preset 6 keeps an 8 MiB window)
XZ_PRESET = 6
XZ_THREADS = 8
SHUFFLE_SEED = 1990
VAL_FRACTION = 0.01
_TRAIN = 0  # the generator domain of training windows


class DataError(RuntimeError):
    """A corpus cannot be built, read or found; the message says what to do."""


# ---------------------------------------------------------------------------------------
# Building the default corpus from the Debian package


def download_deb(package: str = PACKAGE, dest: Path = CACHE) -> Path:
    """`apt-get download PACKAGE` into dest; clear errors on machines without apt."""
    hint = (f"The default corpus is built from Debian's package {package} "
            f"(`apt-get download {package}`). Download the .deb on a Debian or Ubuntu "
            f"machine and pass `elman data --deb FILE`, or train on any raw byte file "
            f"with `elman train --data FILE`.")
    if shutil.which("apt-get") is None:
        raise DataError(f"apt-get not found: this machine is not Debian-based. {hint}")
    dest.mkdir(parents=True, exist_ok=True)
    found = sorted(dest.glob(f"{package}_*.deb"))
    if found:
        return found[-1]
    cmd = ["apt-get", "download", package]
    proc = subprocess.run(cmd, cwd=dest, capture_output=True, text=True)
    found = sorted(dest.glob(f"{package}_*.deb"))
    if proc.returncode != 0 or not found:
        raise DataError(f"`{' '.join(cmd)}` failed (exit {proc.returncode}) in {dest}:\n"
                        f"{proc.stderr.strip() or proc.stdout.strip()}\n"
                        f"If the package lists are stale, run `apt-get update` first. {hint}")
    return found[-1]


def _ar_members(blob: bytes) -> dict[str, bytes]:
    """Members of a Debian package (an `ar` archive)."""
    if not blob.startswith(b"!<arch>\n"):
        raise DataError("not a Debian package (.deb): missing the ar archive header")
    out, pos = {}, 8
    while pos + 60 <= len(blob):
        header = blob[pos:pos + 60]
        name = header[:16].decode().strip().rstrip("/")
        size = int(header[48:58].decode().strip())
        out[name] = blob[pos + 60:pos + 60 + size]
        pos += 60 + size + (size & 1)
    return out


def _open_tar(name: str, data: bytes) -> tarfile.TarFile:
    if name.endswith(".zst"):
        raise DataError(f"{name} is zstd-compressed, which Python's standard library cannot "
                        f"read; unpack it with `dpkg-deb -x` and pass the tarball instead")
    return tarfile.open(fileobj=io.BytesIO(data), mode="r:*")


def _deb_info(deb: Path) -> tuple[dict[str, str], bytes]:
    """The package's control fields and its data.tar member."""
    members = _ar_members(deb.read_bytes())
    control = next((k for k in members if k.startswith("control.tar")), None)
    data = next((k for k in members if k.startswith("data.tar")), None)
    if control is None or data is None:
        raise DataError(f"{deb} lacks control.tar or data.tar: not a valid .deb")
    with _open_tar(control, members[control]) as tar:
        text = tar.extractfile(next(m for m in tar.getmembers()
                                    if m.name.lstrip("./") == "control")).read().decode()
    fields = dict(line.split(": ", 1) for line in text.splitlines() if ": " in line)
    return fields, members[data]


def is_text(blob: bytes) -> bool:
    """A document: non-empty, valid UTF-8, no NUL and no separator byte."""
    return bool(blob) and cleaning.is_text(blob)


def _documents(deb: Path) -> tuple[dict[str, str], list[tuple[str, bytes]]]:
    fields, data_tar = _deb_info(deb)
    with _open_tar("data.tar", data_tar) as outer:
        member = next((m for m in outer.getmembers() if m.name.lstrip("./") == TARBALL), None)
        if member is None:
            raise DataError(f"{deb} does not hold {TARBALL}")
        inner_xz = outer.extractfile(member).read()
    docs = []
    with tarfile.open(fileobj=io.BytesIO(inner_xz), mode="r|xz") as tar:
        for m in tqdm(tar, desc="reading the kernel tree", unit=" files"):
            if m.isfile():
                blob = tar.extractfile(m).read()
                if is_text(blob):
                    docs.append((m.name, blob))
    docs.sort(key=lambda d: d[0])
    return fields, docs


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 24), b""):
            h.update(block)
    return h.hexdigest()


def manifest_path(data: Path | str) -> Path:
    """`corpus.txt` and `corpus.txt.xz` both have the manifest `corpus.txt.json`."""
    data = Path(data)
    return data.with_name(data.name.removesuffix(".xz") + ".json")


def read_manifest(data: Path | str) -> dict | None:
    path = manifest_path(data)
    return json.loads(path.read_text()) if path.exists() else None


def _write_docs(docs: list[bytes], n_val: int, out: Path) -> dict:
    """Join documents by 0x1E into out; the last n_val documents are the validation split."""
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    with open(tmp, "wb") as f:
        f.write(bytes([SEP]).join(docs))
    os.replace(tmp, out)
    n_train = len(docs) - n_val
    val_offset = sum(len(d) + 1 for d in docs[:n_train])
    size = out.stat().st_size
    return {"bytes": size, "documents": len(docs), "sha256": sha256(out),
            "val": {"offset": val_offset, "bytes": size - val_offset, "documents": n_val}}


def build(deb: Path | None = None, out: Path = CORPORA[CORPUS_NAME], seed: int = SHUFFLE_SEED,
          val_fraction: float = VAL_FRACTION) -> dict:
    """Build the Linux corpus from the .deb (downloaded if not given); returns the manifest."""
    deb = Path(deb) if deb else download_deb()
    fields, docs = _documents(deb)
    if not docs:
        raise DataError(f"no text documents found in {deb}")
    order = np.random.default_rng(seed).permutation(len(docs))
    texts = [docs[i][1] for i in order]
    n_val = max(1, int(np.ceil(len(texts) * val_fraction)))
    manifest = {
        "name": CORPUS_NAME, "built_by": "elman data",
        "package": fields.get("Package", PACKAGE), "version": fields.get("Version"),
        "deb": deb.name, "deb_sha256": sha256(deb), "source": TARBALL,
        "filter": "regular files that are valid UTF-8 with no NUL and no 0x1E byte",
        "separator": "0x1E", "shuffle_seed": seed, "val_fraction": val_fraction,
        **_write_docs(texts, n_val, Path(out)),
    }
    manifest_path(out).write_text(json.dumps(manifest, indent=2) + "\n")
    return manifest


def _split_docs(path: Path, manifest: dict) -> tuple[list[bytes], list[tuple[str, list[bytes]]]]:
    """Training documents, and validation documents grouped by source (one group 'all'
    when the manifest names no sources)."""
    blob = Path(path).read_bytes()
    off = manifest["val"]["offset"]
    train = blob[:off - 1].split(bytes([SEP])) if off > 0 else []
    ranges = manifest["val"].get("sources") or [["all", off, len(blob)]]
    return train, [(name, blob[a:b].split(bytes([SEP]))) for name, a, b in ranges]


def _val_ranges(groups: list[tuple[str, list[bytes]]], offset: int) -> list[list]:
    """[name, start, end) byte ranges of validation groups written from offset on."""
    out, pos = [], offset
    for name, docs in groups:
        end = pos + sum(len(d) + 1 for d in docs) - 1
        out.append([name, pos, end])
        pos = end + 1
    return out


def _take(docs: list[bytes], budget: int) -> list[bytes]:
    """Documents in order, each one that still fits in the byte budget (separators counted)."""
    out, used = [], 0
    for d in docs:
        if used + len(d) + 1 <= budget:
            out.append(d)
            used += len(d) + 1
    return out


def subset(src: Path, out: Path, train_bytes: int, val_bytes: int | None = None) -> dict:
    """A smaller corpus: a prefix of src's training documents (up to train_bytes) and of each
    source's validation documents (up to its share of val_bytes but at least its shortest
    document; all if val_bytes is None), same layout and manifest."""
    manifest = read_manifest(src)
    if manifest is None:
        raise DataError(f"{src} has no manifest {manifest_path(src)}; build it with `elman data`")
    train, groups = _split_docs(src, manifest)
    train = _take(train, train_bytes)
    if val_bytes is not None:
        total = sum(len(d) + 1 for _, docs in groups for d in docs)
        groups = [(name, _take(docs, val_bytes * sum(len(d) + 1 for d in docs) / total)
                   or [min(docs, key=len)]) for name, docs in groups]
    groups = [(name, docs) for name, docs in groups if docs]
    val = [d for _, docs in groups for d in docs]
    if not train or not val:
        raise DataError(f"a subset of {train_bytes} + {val_bytes} bytes holds no whole document")
    sub = {k: v for k, v in manifest.items() if k not in ("bytes", "documents", "sha256", "val")}
    sub["subset_of"] = {"sha256": manifest["sha256"], "bytes": manifest["bytes"],
                        "train_bytes": train_bytes, "val_bytes": val_bytes}
    sub.update(_write_docs(train + val, len(val), Path(out)))
    if manifest["val"].get("sources"):
        sub["val"]["sources"] = _val_ranges(groups, sub["val"]["offset"])
    manifest_path(out).write_text(json.dumps(sub, indent=2) + "\n")
    return sub


def pack(src: Path, out: Path, megabytes: float, part_mb: float | None = None) -> dict:
    """An xz-compressed subset of about `megabytes` MB of training text plus src's whole
    validation split, for carrying to a GPU host. Writes out (.xz) and its manifest; with
    part_mb, the .xz is cut into files `<out>.000`, `<out>.001`, ... of at most part_mb MB
    each (unpack joins them)."""
    out = Path(out)
    text = out.with_name(out.name.removesuffix(".xz"))
    manifest = subset(src, text, int(megabytes * 1e6))
    manifest["xz_streams"] = compress(text, out.with_name(out.name + ".tmp"))
    os.replace(out.with_name(out.name + ".tmp"), out)
    text.unlink()
    manifest["xz_bytes"] = out.stat().st_size
    manifest["xz_sha256"] = sha256(out)
    if part_mb:
        manifest["xz_parts"] = split_parts(out, int(part_mb * 2**20))
        out.unlink()
    manifest_path(out).write_text(json.dumps(manifest, indent=2) + "\n")
    return manifest


def _in_order(jobs: Iterator[bytes], fn: Callable[[bytes], bytes], threads: int, desc: str,
              total: int) -> Iterator[bytes]:
    """fn(job) for every job, in order, computed on `threads` threads with about threads + 1
    jobs in flight (liblzma runs without the GIL)."""
    pending: deque = deque()
    with ThreadPoolExecutor(threads) as pool, tqdm(total=total, desc=f"{desc} ({threads} threads)",
                                                   unit="block") as bar:
        for job in jobs:
            pending.append(pool.submit(fn, job))
            while len(pending) > threads or (pending and pending[0].done()):
                yield pending.popleft().result()
                bar.update()
        while pending:
            yield pending.popleft().result()
            bar.update()


def _threads(threads: int | None) -> int:
    return threads or min(XZ_THREADS, os.cpu_count() or 1)


def compress(src: Path, out: Path, block: int = XZ_BLOCK, threads: int | None = None) -> list[int]:
    """src as xz: independent streams of `block` bytes of src each, in order (a .xz file may
    hold several; lzma.open and xz read them as one), compressed on up to XZ_THREADS threads.
    Returns the streams' compressed sizes (`decompress` reads them in parallel). The same bytes
    for the same src, block and liblzma, whatever the thread count."""
    sizes = []
    with open(src, "rb") as f, open(out, "wb") as z:
        for data in _in_order(iter(lambda: f.read(block), b""), lambda b: lzma.compress(b, preset=XZ_PRESET),
                              _threads(threads), "xz", -(-src.stat().st_size // block)):
            z.write(data)
            sizes.append(len(data))
    return sizes


def decompress(xz: Path, out: Path, streams: list[int] | None = None, threads: int | None = None) -> None:
    """Decompress xz into out: with `streams` (the compressed sizes `compress` returned), the
    streams on up to XZ_THREADS threads, else in one pass. LZMAError or EOFError where the
    file is corrupt or truncated."""
    if not streams or xz.stat().st_size != sum(streams):
        with lzma.open(xz, "rb") as z, open(out, "wb") as f:
            shutil.copyfileobj(z, f, 1 << 22)
        return

    def chunks() -> Iterator[bytes]:
        with open(xz, "rb") as f:
            for n in streams:
                yield f.read(n)

    with open(out, "wb") as f:
        for data in _in_order(chunks(), lzma.decompress, _threads(threads), "unxz", len(streams)):
            f.write(data)


def split_parts(path: Path, part_bytes: int) -> list[str]:
    """Cut a file into `<path>.000`, `<path>.001`, ... of at most part_bytes each."""
    names = []
    with open(path, "rb") as f:
        for i, block in enumerate(iter(lambda: f.read(part_bytes), b"")):
            part = path.with_name(f"{path.name}.{i:03d}")
            part.write_bytes(block)
            names.append(part.name)
    return names


def _join_parts(xz: Path, manifest: dict) -> None:
    """Rebuild a packed .xz from its parts and check it against the manifest's sha256."""
    parts = [xz.with_name(n) for n in manifest["xz_parts"]]
    missing = [p.name for p in parts if not p.exists()]
    if missing:
        raise DataError(f"{xz} is carried in parts; missing: {', '.join(missing)}")
    tmp = xz.with_name(f"{xz.name}.tmp{os.getpid()}")
    with open(tmp, "wb") as f:
        for p in parts:
            with open(p, "rb") as g:
                shutil.copyfileobj(g, f, 1 << 22)
    if sha256(tmp) != manifest.get("xz_sha256"):
        tmp.unlink()
        raise DataError(f"the parts of {xz} join to a file whose sha256 differs from its manifest")
    os.replace(tmp, xz)


def collect_parts(xz: Path | str, dest: Path | str, wait: float = 900.0, poll: float = 2.0) -> int:
    """Wait (at most `wait` s) until every part of the packed corpus `xz` that its manifest names
    lies beside it at the manifest's total size, then copy the manifest and the parts into the
    folder `dest`; returns the parts' bytes. For parts that arrive one by one (one device call
    each) while a GPU pass runs; `unpack` checks their sha256 when a run reads them."""
    xz, dest = Path(xz), Path(dest)
    start = shown = time.monotonic()
    while True:
        m = read_manifest(xz) or {"xz_parts": [], "xz_bytes": None}
        parts = [xz.with_name(n) for n in m.get("xz_parts", [])]
        have = sum(p.stat().st_size for p in parts if p.is_file())
        if parts and have == m["xz_bytes"]:
            break
        if time.monotonic() - start > wait:
            raise DataError(f"{have:,} of {m['xz_bytes'] or '?'} bytes of the parts of {xz} "
                            f"after {wait:.0f} s")
        if time.monotonic() - shown > 60:
            print(f"{xz.name}: waiting, {sum(p.is_file() for p in parts)} of {len(parts)} parts here", flush=True)
            shown = time.monotonic()
        time.sleep(poll)
    dest.mkdir(parents=True, exist_ok=True)
    for f in (manifest_path(xz), *parts):
        if f.parent.resolve() != dest.resolve():
            shutil.copy2(f, dest / f.name)
    return have


def repart(xz: Path, part_mb: float) -> list[str]:
    """Cut a packed corpus's .xz (or its parts, joined and checked first) into parts of at most
    part_mb MiB, removing the old parts and updating the manifest; returns the new names."""
    xz = Path(xz)
    manifest = read_manifest(xz)
    if manifest is None or "xz_sha256" not in manifest:
        raise DataError(f"{xz} has no packed-corpus manifest {manifest_path(xz)}")
    old = [xz.with_name(n) for n in manifest.get("xz_parts", [])]
    if not xz.exists():
        _join_parts(xz, manifest)
    for p in old:
        p.unlink(missing_ok=True)
    manifest["xz_parts"] = split_parts(xz, int(part_mb * 2**20))
    xz.unlink()
    manifest_path(xz).write_text(json.dumps(manifest, indent=2) + "\n")
    return manifest["xz_parts"]


def unpack(xz: Path, out_dir: Path | None = None) -> Path:
    """Decompress a packed corpus (next to it by default) and check it against its manifest."""
    xz = Path(xz)
    manifest = read_manifest(xz)
    if manifest is None:
        raise DataError(f"{xz} has no manifest {manifest_path(xz)}: carry both files")
    out = (Path(out_dir) if out_dir else xz.parent) / xz.name.removesuffix(".xz")
    if out.exists() and out.stat().st_size == manifest["bytes"] and read_manifest(out) == manifest:
        return out
    if not xz.exists() and manifest.get("xz_parts"):
        _join_parts(xz, manifest)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f"{out.name}.tmp{os.getpid()}")  # jobs may unpack the same file at once
    try:
        decompress(xz, tmp, manifest.get("xz_streams"))
    except (lzma.LZMAError, EOFError) as exc:
        tmp.unlink(missing_ok=True)
        raise DataError(f"{xz} is corrupt or truncated ({exc})") from exc
    if sha256(tmp) != manifest["sha256"]:
        tmp.unlink()
        raise DataError(f"{xz} decompresses to data whose sha256 differs from its manifest")
    os.replace(tmp, out)
    if manifest_path(out) != manifest_path(xz):
        tmp = manifest_path(out).with_name(f"{manifest_path(out).name}.tmp{os.getpid()}")
        tmp.write_text(json.dumps(manifest, indent=2) + "\n")
        os.replace(tmp, manifest_path(out))
    return out


# ---------------------------------------------------------------------------------------
# The loader


class ByteData:
    """A memory-mapped byte file with a training region and a held-out validation region."""

    def __init__(self, path: Path | str, val_fraction: float = VAL_FRACTION):
        path = Path(path)
        if path.suffix == ".xz":
            path = unpack(path)
        if not path.exists():
            hint = (" Build the default corpus with `elman data`." if path == DEFAULT_DATA
                    else "")
            raise DataError(f"data file {path} does not exist.{hint}")
        if path.stat().st_size == 0:
            raise DataError(f"data file {path} is empty")
        self.path = path
        self.bytes = np.memmap(path, dtype=np.uint8, mode="r")
        self.manifest = read_manifest(path)
        if self.manifest is not None:
            if self.manifest["bytes"] != len(self.bytes):
                raise DataError(f"{path} has {len(self.bytes)} bytes but its manifest says "
                                f"{self.manifest['bytes']}: rebuild it or remove the manifest")
            self.val_start = self.manifest["val"]["offset"]
        else:
            self.val_start = len(self.bytes) - max(1, int(len(self.bytes) * val_fraction))

    def __len__(self) -> int:
        return len(self.bytes)

    def _check(self, size: int, T: int, what: str) -> None:
        if size < T + 1:
            raise DataError(f"the {what} region of {self.path} has {size} bytes, fewer than "
                            f"one window of T+1 = {T + 1}")

    def windows(self, positions: np.ndarray, T: int) -> np.ndarray:
        """[len(positions), T+1] uint8: the bytes at p .. p+T for every position (one gather)."""
        positions = np.asarray(positions, dtype=np.int64)
        return np.asarray(self.bytes[positions[:, None] + np.arange(T + 1)])

    def train_positions(self, step: int, batch: int, T: int, seed: int, rank: int = 0) -> np.ndarray:
        self._check(self.val_start, T, "training")
        rng = np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(_TRAIN, rank, step)))
        return rng.integers(0, self.val_start - T, size=batch)

    def batch(self, step: int, batch: int, T: int, seed: int, rank: int = 0) -> np.ndarray:
        """The training windows of one optimizer step: [batch, T+1] uint8."""
        return self.windows(self.train_positions(step, batch, T, seed, rank), T)

    def val_sources(self) -> list[tuple[str, int, int]]:
        """(source, start, end) byte ranges of the validation split; one range 'all' when
        the manifest names no sources."""
        ranges = (self.manifest or {}).get("val", {}).get("sources")
        return [tuple(r) for r in ranges] if ranges else [("all", self.val_start, len(self.bytes))]

    def val_tiles(self, T: int) -> int:
        """How many windows of T+1 bytes at stride T tile the validation split."""
        size = len(self.bytes) - self.val_start
        self._check(size, T, "validation")
        return (size - 1) // T

    def val_positions(self, T: int, n: int | None = None) -> np.ndarray:
        """Starts of the validation windows: every tile (n None or at least the tile count),
        or n evenly spaced tiles. The same for every model and seed."""
        tiles = self.val_tiles(T)
        k = np.arange(tiles) if n is None or n >= tiles else \
            np.unique(np.linspace(0, tiles - 1, n).round().astype(np.int64))
        return self.val_start + T * k

    def val_batches(self, T: int, batch: int, n: int | None = None) -> list[np.ndarray]:
        """The validation windows (`val_positions`) in batches of [<=batch, T+1] uint8."""
        pos = self.val_positions(T, n)
        return [self.windows(pos[i:i + batch], T) for i in range(0, len(pos), batch)]

    def target_sources(self, positions: np.ndarray, T: int) -> tuple[list[str], np.ndarray]:
        """Source names and, for windows at these positions, [len, T] int indices into them
        of the source each predicted byte (p+1 .. p+T) belongs to (-1: a separator between
        sources)."""
        ranges = self.val_sources()
        names = [r[0] for r in ranges]
        target = np.asarray(positions)[:, None] + 1 + np.arange(T)[None, :]
        out = np.full(target.shape, -1, dtype=np.int64)
        for i, (_, a, b) in enumerate(ranges):
            out[(target >= a) & (target < b)] = i
        return names, out


class Batches:
    """Training batches from `start_step` on. Iterating yields (step, LongTensor [batch, T+1]
    on device). `prefetch()` gathers the next batch on the host and queues its copy (from
    pinned memory on CUDA): the trainer calls it once it has queued a step, so the host work
    runs while the GPU computes. There is no loader thread: one would hold the GIL while it
    gathers a batch and delay the loop that launches the next step (dev/lm_input_gpu_check.py)."""

    def __init__(self, data: ByteData, batch: int, T: int, seed: int, rank: int = 0,
                 start_step: int = 0, device: torch.device | str = "cpu"):
        self.data, self.batch, self.T, self.seed, self.rank = data, batch, T, seed, rank
        self.device = torch.device(device)
        self.step = start_step
        self._next: tuple[int, torch.Tensor] | None = None

    def prefetch(self) -> None:
        """Gather the next batch and queue its copy to the device (once until it is taken)."""
        if self._next is None:
            x = torch.from_numpy(self.data.batch(self.step, self.batch, self.T, self.seed, self.rank))
            if self.device.type == "cuda":
                x = x.pin_memory()
            self._next = (self.step, x.to(self.device, non_blocking=True).long())
            self.step += 1

    def __iter__(self) -> Iterator[tuple[int, torch.Tensor]]:
        while True:
            self.prefetch()
            item, self._next = self._next, None
            yield item


# ---------------------------------------------------------------------------------------
# `elman data`


def _size(text: str) -> float:
    """'256K', '200M', '1.5G' or a plain number of bytes."""
    units = {"K": 1e3, "M": 1e6, "G": 1e9}
    text = text.strip().upper().removesuffix("B")
    return float(text[:-1]) * units[text[-1]] if text[-1:] in units else float(text)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--name", choices=tuple(CORPORA), default=MIX_NAME,
                   help="which corpus to build or read (default %(default)s; linux-6.1 is the "
                        "Linux source tree alone)")
    p.add_argument("--deb", type=Path, help=f"linux-6.1: a downloaded {PACKAGE} .deb (default: apt-get download)")
    p.add_argument("--packages", type=Path, metavar="DIR",
                   help=f"{MIX_NAME}: a folder of already downloaded .debs to use before "
                        "`apt-get download` (default .cache/data)")
    p.add_argument("--out", type=Path, help="output file (default depends on the action)")
    p.add_argument("--corpus", type=Path,
                   help="the built corpus that --pack and --slice read (default data/<name>.txt)")
    p.add_argument("--wait", type=float, default=900.0, metavar="S",
                   help="with --collect: how long to wait for the parts (default %(default)g s)")
    p.add_argument("--part-mb", type=float, metavar="MB",
                   help="with --pack or --repart: cut the .xz into parts of at most MB MiB (to carry)")
    act = p.add_mutually_exclusive_group()
    act.add_argument("--pack", type=float, metavar="MB",
                     help="write an xz subset of about MB megabytes of training text plus the "
                          "validation split (default out: .cache/data/<name>-<MB>M.txt.xz)")
    act.add_argument("--unpack", type=Path, metavar="FILE", help="decompress a packed corpus")
    act.add_argument("--repart", type=Path, metavar="FILE",
                     help="cut a packed corpus (FILE.xz) into parts of --part-mb MiB anew")
    act.add_argument("--collect", type=Path, metavar="FILE",
                     help="wait until every part of a packed corpus (FILE.xz) lies beside its "
                          "manifest, then copy them into --out (a folder; default FILE's)")
    act.add_argument("--slice", metavar="SIZE",
                     help="write a small test slice, e.g. 256K (default out: tests/data/<name>-slice.txt)")
    act.add_argument("--info", type=Path, metavar="FILE", help="print a data file's manifest and split")


def fetcher(folder: Path | None) -> Callable[[str], Path]:
    """package -> its .deb: from folder if there, else `apt-get download` into the cache."""
    def fetch(package: str) -> Path:
        for d in (folder, CACHE):
            found = sorted(Path(d).glob(f"{package}_*.deb")) if d else []
            if found:
                return found[-1]
        return download_deb(package, CACHE)
    return fetch


def build_named(name: str, out: Path, deb: Path | None = None, packages: Path | None = None) -> dict:
    """Build the corpus called name into out; returns its manifest."""
    if name == CORPUS_NAME:
        return build(deb, out)
    from . import corpus, sources
    try:
        return corpus.build(out, fetcher(packages), name=name)
    except (corpus.CorpusError, sources.SourceError) as exc:
        raise DataError(str(exc)) from exc


def _ensure_corpus(args: argparse.Namespace) -> Path:
    path = args.corpus or CORPORA[args.name]
    if not path.exists():
        print(f"{path} is missing: building it first")
        build_named(args.name, path, args.deb, args.packages)
    return path


def _describe(m: dict) -> str:
    if "sources" not in m:
        return f"from {m['package']} {m['version']}"
    return "; ".join(f"{s} {v['share']:.1%}" for s, v in m["sources"].items())


def main(args: argparse.Namespace) -> int:
    try:
        if args.pack is not None:
            src = _ensure_corpus(args)
            name = (read_manifest(src) or {}).get("name", src.stem)
            out = args.out or CACHE / f"{name}-{args.pack:g}M.txt.xz"
            m = pack(src, out, args.pack, args.part_mb)
            where = f"{len(m['xz_parts'])} parts {out.name}.000 ..." if m.get("xz_parts") else str(out)
            print(f"wrote {where} ({m['xz_bytes'] / 1e6:.1f} MB xz, {m['bytes'] / 1e6:.1f} MB text, "
                  f"{m['documents']} documents) and {manifest_path(out)}")
        elif args.repart is not None:
            if not args.part_mb:
                raise DataError("--repart needs --part-mb")
            names = repart(args.repart, args.part_mb)
            print(f"cut {args.repart} into {len(names)} parts: {', '.join(names)}")
        elif args.collect is not None:
            dest = args.out or args.collect.parent
            have = collect_parts(args.collect, dest, args.wait)
            print(f"collected {have:,} bytes of the parts of {args.collect.name} in {dest}")
        elif args.unpack is not None:
            out = unpack(args.unpack, args.out)
            print(f"unpacked {args.unpack} -> {out}")
        elif args.slice is not None:
            src = _ensure_corpus(args)
            total = int(_size(args.slice))
            name = (read_manifest(src) or {}).get("name", args.name)
            out = args.out or ROOT / "tests" / "data" / f"{name}-slice.txt"
            m = subset(src, out, total - total // 16, total // 16)
            print(f"wrote {out} ({m['bytes']} bytes, {m['documents']} documents, "
                  f"validation from byte {m['val']['offset']})")
        elif args.info is not None:
            d = ByteData(args.info)
            print(json.dumps({"path": str(d.path), "bytes": len(d), "val_start": d.val_start,
                              "manifest": d.manifest}, indent=2))
        else:
            out = args.out or CORPORA[args.name]
            m = build_named(args.name, out, args.deb, args.packages)
            print(f"wrote {out}: {m['bytes'] / 1e6:.1f} MB, {m['documents']} documents "
                  f"({_describe(m)}); validation: {m['val']['documents']} documents "
                  f"({m['val']['bytes'] / 1e6:.1f} MB)")
    except DataError as exc:
        print(f"elman data: {exc}")
        return 1
    return 0
