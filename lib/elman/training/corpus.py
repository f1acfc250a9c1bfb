"""The default corpus: a capped, cleaned, deduplicated mix of code bases and prose from
Debian packages (`elman data`). Chapter: book/chapters/training_protocol.ipynb.

Build, in order (every step deterministic, so two builds give the same bytes):

1. Read each source's packages (`sources.SOURCES`, downloaded with `apt-get download`).
2. Clean: a file is dropped by the first rule of `cleaning.reject_reason` it breaks, then
   as an exact or near-exact duplicate of an earlier document (`cleaning.Dedup`, over all
   sources in their fixed order). Every drop is counted per source and reason.
3. Cap: no source above `cap` (35 %) of the corpus's bytes. The cap c solves
   c = cap * sum_s min(bytes_s, c); a source above it keeps its documents in the order of
   a stable hash of their paths until c is reached.
4. Split by document, stratified by source: within each source, documents in the order of
   a second stable hash of their paths go to validation while they fit in `val_fraction`
   of the source's bytes, so every source has the same share of validation as of the
   corpus (`check_shares`).
5. Write: the training documents in a seeded shuffled order, then the validation
   documents grouped by source, all joined by 0x1E. The manifest (`<out>.json`) holds the
   package names, versions and sha256s, the cleaning rules and what each removed, the
   per-source bytes, shares and validation byte ranges, and the sha256 of the corpus and
   of the file list (`<out>.files.tsv`: split, source, bytes, sha256, path per document).
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections import Counter, defaultdict
from pathlib import Path
from typing import Callable, Iterator

import numpy as np
from tqdm import tqdm

from . import cleaning
from .sources import SOURCES, Package, Source, chunks, included, package_files, package_info

SEP = cleaning.SEP
CAP = 0.35
VAL_FRACTION = 0.01
SHUFFLE_SEED = 1990
SHARE_TOLERANCE = 0.1  # relative difference allowed between a source's validation and corpus shares


class CorpusError(RuntimeError):
    """The corpus cannot be built or fails a check; the message says what."""


def stable_key(salt: str, path: str) -> bytes:
    return hashlib.sha256(f"{salt}:{path}".encode()).digest()


def cap_bytes(sizes: dict[str, int], cap: float = CAP) -> float:
    """The per-source byte cap c with c = cap * sum min(size, c) (inf when no source is over)."""
    total = sum(sizes.values())
    if not sizes or max(sizes.values()) <= cap * total:
        return float("inf")
    if len(sizes) * cap <= 1:
        raise CorpusError(f"{len(sizes)} sources cannot each stay at or below {cap:.0%} of the "
                          f"bytes: add sources or raise the cap")
    c = cap * total
    for _ in range(200):
        nxt = cap * sum(min(s, c) for s in sizes.values())
        if abs(nxt - c) < 0.5:
            break
        c = nxt
    return c


def _fit(docs: list[dict], budget: float) -> tuple[list[dict], list[dict]]:
    """Documents (already in order) that fit in the budget, and the rest."""
    taken, rest, used = [], [], 0
    for d in docs:
        if used + d["bytes"] <= budget:
            taken.append(d)
            used += d["bytes"]
        else:
            rest.append(d)
    return taken, rest


def _clean(sources: tuple[Source, ...], fetch: Callable[[str], Path], work: Path
           ) -> tuple[dict[str, list[dict]], dict[str, dict]]:
    """Steps 1-2: every source's kept documents (path, bytes, sha256, offset in its part file
    under work) and its statistics."""
    dedup = cleaning.Dedup()
    docs: dict[str, list[dict]] = {}
    stats: dict[str, dict] = {}
    for src in sources:
        kept, removed = [], defaultdict(lambda: [0, 0])
        raw = [0, 0]
        packages = []
        with open(work / f"{src.name}.part", "wb") as part:
            for pkg in src.packages:
                path = fetch(pkg.name)
                packages.append(package_info(path))
                for name, blob, why in tqdm(_documents(path, pkg, src), desc=f"{src.name}: {pkg.name}",
                                            unit=" files", mininterval=2):
                    raw[0] += 1
                    raw[1] += len(blob)
                    why = why or cleaning.reject_reason(blob) or dedup.check(blob)
                    if why:
                        removed[why][0] += 1
                        removed[why][1] += len(blob)
                        continue
                    kept.append({"path": f"{pkg.name}/{name}", "source": src.name,
                                 "bytes": len(blob), "sha256": hashlib.sha256(blob).hexdigest(),
                                 "offset": part.tell()})
                    part.write(blob)
        docs[src.name] = kept
        stats[src.name] = {"kind": src.kind, "about": src.about, "packages": packages,
                           "raw_documents": raw[0], "raw_bytes": raw[1],
                           "removed": {k: {"documents": v[0], "bytes": v[1]}
                                       for k, v in sorted(removed.items())},
                           "clean_documents": len(kept), "clean_bytes": sum(d["bytes"] for d in kept)}
    return docs, stats


def _documents(path: Path, pkg: Package, src: Source) -> Iterator[tuple[str, bytes, str | None]]:
    """The package's included files (long ones cut into chunks when the package asks), each
    with 'path' when the source excludes it, else None."""
    for name, blob in package_files(path, pkg.archives):
        why = included(name, pkg, src)
        if why == "not-included":
            continue
        if pkg.chunk and len(blob) > pkg.chunk:
            for i, piece in enumerate(chunks(blob, pkg.chunk)):
                yield f"{name}#{i:05d}", piece, why
        else:
            yield name, blob, why


def check_shares(manifest: dict, tolerance: float = SHARE_TOLERANCE) -> list[str]:
    """Sources whose validation share differs from their corpus share by more than the
    relative tolerance (or that have no validation bytes); empty when the split is fine."""
    total = sum(s["bytes"] for s in manifest["sources"].values())
    val = sum(s["val_bytes"] for s in manifest["sources"].values())
    problems = []
    for name, s in manifest["sources"].items():
        share, val_share = s["bytes"] / total, s["val_bytes"] / max(val, 1)
        if s["val_bytes"] == 0 or abs(val_share - share) > tolerance * share:
            problems.append(f"{name}: {val_share:.3%} of validation but {share:.3%} of the corpus")
    return problems


def build(out: Path, fetch: Callable[[str], Path], sources: tuple[Source, ...] = SOURCES,
          name: str = "debian-mix", cap: float = CAP, val_fraction: float = VAL_FRACTION,
          seed: int = SHUFFLE_SEED) -> dict:
    """Build the corpus into out (see the module docstring); returns the manifest.
    `fetch(package)` gives a package's .deb (or, in tests, a folder or tarball)."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    work = out.with_name(out.name + ".parts")
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir()
    try:
        docs, stats = _clean(sources, fetch, work)
        return _assemble(out, work, docs, stats, name, cap, val_fraction, seed)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _assemble(out: Path, work: Path, docs: dict[str, list[dict]], stats: dict[str, dict],
              name: str, cap: float, val_fraction: float, seed: int) -> dict:
    empty = [s for s, d in docs.items() if not d]
    if empty:
        raise CorpusError(f"sources with no document after cleaning: {', '.join(empty)}")
    c = cap_bytes({s: st["clean_bytes"] for s, st in stats.items()}, cap)
    train, val = [], {}
    for s, d in docs.items():
        kept, dropped = _fit(sorted(d, key=lambda x: stable_key("cap", x["path"])), c)
        stats[s]["capped"] = {"documents": len(dropped), "bytes": sum(x["bytes"] for x in dropped)}
        target = val_fraction * sum(x["bytes"] for x in kept)
        val[s], rest = _fit(sorted(kept, key=lambda x: stable_key("split", x["path"])), target)
        train += rest
    train.sort(key=lambda x: (x["source"], x["path"]))
    train = [train[i] for i in np.random.default_rng(seed).permutation(len(train))]
    parts = {s: np.memmap(work / f"{s}.part", dtype=np.uint8, mode="r") if stats[s]["clean_bytes"]
             else np.zeros(0, np.uint8) for s in docs}
    ordered = train + [x for s in docs for x in val[s]]
    tmp = out.with_name(out.name + ".tmp")
    h = hashlib.sha256()
    ranges, pos = {}, 0
    with open(tmp, "wb") as f:
        for i, x in enumerate(tqdm(ordered, desc="writing", unit=" docs", mininterval=2)):
            blob = (b"" if i == 0 else bytes([SEP])) + parts[x["source"]][x["offset"]:x["offset"] + x["bytes"]].tobytes()
            f.write(blob)
            h.update(blob)
            start = pos + (i > 0)
            pos += len(blob)
            x["start"] = start
            if i >= len(train):
                lo, hi = ranges.get(x["source"], (start, pos))
                ranges[x["source"]] = (min(lo, start), pos)
    os.replace(tmp, out)
    files = out.with_name(out.name + ".files.tsv")
    lines = ["split\tsource\tbytes\tsha256\tpath\n"] + [
        f"{'val' if i >= len(train) else 'train'}\t{x['source']}\t{x['bytes']}\t{x['sha256']}\t{x['path']}\n"
        for i, x in enumerate(ordered)]
    files.write_text("".join(lines))
    val_offset = ordered[len(train)]["start"] if len(ordered) > len(train) else pos
    sources = {}
    for s, st in stats.items():
        vbytes = sum(x["bytes"] for x in val[s])
        total = sum(x["bytes"] for x in ordered if x["source"] == s)
        sources[s] = {**st, "documents": sum(1 for x in ordered if x["source"] == s), "bytes": total,
                      "val_documents": len(val[s]), "val_bytes": vbytes,
                      "val_range": list(ranges.get(s, (val_offset, val_offset)))}
    doc_bytes = sum(x["bytes"] for x in ordered)
    for s in sources.values():
        s["share"] = s["bytes"] / doc_bytes
    manifest = {
        "name": name, "built_by": "elman data", "separator": "0x1E", "shuffle_seed": seed,
        "val_fraction": val_fraction, "cap": cap, "cap_bytes": None if c == float("inf") else c,
        "rules": {**cleaning.RULES, "near_jaccard": cleaning.NEAR_JACCARD,
                  "minhash": f"{cleaning.PERMUTATIONS} functions, {cleaning.BANDS} bands, "
                             f"sets of distinct stripped lines, at least {cleaning.MIN_LINES}"},
        "bytes": pos, "documents": len(ordered), "sha256": h.hexdigest(),
        "val": {"offset": val_offset, "bytes": pos - val_offset, "documents": len(ordered) - len(train),
                "sources": [[s, *sources[s]["val_range"]] for s in docs if val[s]]},
        "files": {"name": files.name, "sha256": hashlib.sha256(files.read_bytes()).hexdigest()},
        "sources": sources,
    }
    problems = check_shares(manifest)
    manifest["share_check"] = problems or "ok"
    out.with_name(out.name + ".json").write_text(json.dumps(manifest, indent=2) + "\n")
    return manifest


def removed_table(manifest: dict) -> list[dict]:
    """One row per source: raw, removed by each rule, capped, kept bytes and share."""
    rows = []
    for s, st in manifest["sources"].items():
        row = {"source": s, "kind": st["kind"], "raw_MB": st["raw_bytes"] / 1e6}
        for reason, v in st["removed"].items():
            row[f"{reason}_MB"] = v["bytes"] / 1e6
        row.update(capped_MB=st["capped"]["bytes"] / 1e6, kept_MB=st["bytes"] / 1e6,
                   share=st["share"], val_MB=st["val_bytes"] / 1e6)
        rows.append(row)
    return rows


def reasons(manifest: dict) -> Counter:
    """Bytes removed per rule over all sources."""
    c: Counter = Counter()
    for st in manifest["sources"].values():
        for reason, v in st["removed"].items():
            c[reason] += v["bytes"]
    return c
