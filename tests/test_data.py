"""The corpus builder (on a small synthetic .deb), subsets, packing and the loader."""
from __future__ import annotations

import io
import json
import os
import tarfile

import numpy as np
import pytest
import torch

from elman.training import data
from elman.cli import main as cli

SLICE = data.TEST_SLICE


def _tar(files: dict[str, bytes], mode: str) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode=mode) as tar:
        for name, blob in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(blob)
            tar.addfile(info, io.BytesIO(blob))
    return buf.getvalue()


def _ar(members: dict[str, bytes]) -> bytes:
    out = b"!<arch>\n"
    for name, blob in members.items():
        out += f"{name + '/':<16}{0:<12}{0:<6}{0:<6}{100644:<8}{len(blob):<10}`\n".encode() + blob
        out += b"\n" if len(blob) % 2 else b""
    return out


DOCS = {f"linux-source-6.1/doc{i:03d}.txt": f"document {i}\n".encode() * (i + 1) for i in range(200)}
REJECTED = {"linux-source-6.1/blob.bin": b"\x00\x01binary", "linux-source-6.1/latin1.txt": b"caf\xe9",
            "linux-source-6.1/sep.txt": b"a\x1eb", "linux-source-6.1/empty.txt": b""}


@pytest.fixture(scope="module")
def fake_deb(tmp_path_factory):
    inner = _tar({**DOCS, **REJECTED}, "w:xz")
    deb = tmp_path_factory.mktemp("deb") / "linux-source-6.1_6.1.0-1_all.deb"
    deb.write_bytes(_ar({
        "debian-binary": b"2.0\n",
        "control.tar.xz": _tar({"./control": b"Package: linux-source-6.1\nVersion: 6.1.0-1\n"}, "w:xz"),
        "data.tar.xz": _tar({"./usr/src/linux-source-6.1.tar.xz": inner}, "w:xz"),
    }))
    return deb


@pytest.fixture(scope="module")
def corpus(fake_deb, tmp_path_factory):
    out = tmp_path_factory.mktemp("corpus") / "linux-6.1.txt"
    return out, data.build(fake_deb, out)


def test_build_keeps_text_documents_joined_by_the_separator(corpus):
    out, m = corpus
    blob = out.read_bytes()
    docs = blob.split(b"\x1e")
    assert sorted(docs) == sorted(DOCS.values())          # rejected files are not there
    assert [d for d in docs] != list(DOCS.values())        # the order is shuffled
    assert m["documents"] == 200 and m["bytes"] == len(blob)
    assert m["package"] == "linux-source-6.1" and m["version"] == "6.1.0-1"
    assert m["sha256"] == data.sha256(out) and len(m["deb_sha256"]) == 64
    assert json.loads(data.manifest_path(out).read_text()) == m


def test_build_is_deterministic_and_holds_out_the_last_documents(corpus, fake_deb, tmp_path):
    out, m = corpus
    again = data.build(fake_deb, tmp_path / "again.txt")
    assert again["sha256"] == m["sha256"]
    blob = out.read_bytes()
    assert m["val"]["documents"] == 2                      # 1 % of 200
    assert blob[m["val"]["offset"] - 1] == data.SEP
    assert len(blob[m["val"]["offset"]:].split(b"\x1e")) == 2


def test_download_without_apt_get_says_what_to_do(monkeypatch, tmp_path):
    monkeypatch.setattr(data.shutil, "which", lambda name: None)
    with pytest.raises(data.DataError, match=r"(?s)not Debian-based.*linux-source-6.1.*--deb.*--data"):
        data.download_deb(dest=tmp_path)


def test_download_failure_names_the_command(monkeypatch, tmp_path):
    bindir = tmp_path / "bin"
    bindir.mkdir()
    fake = bindir / "apt-get"
    fake.write_text("#!/bin/sh\necho 'E: Unable to locate package' >&2\nexit 100\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bindir}:{os.environ['PATH']}")
    with pytest.raises(data.DataError, match=r"(?s)apt-get download linux-source-6.1.*exit 100.*Unable to locate"):
        data.download_deb(dest=tmp_path / "cache")


def test_not_a_deb(tmp_path):
    bad = tmp_path / "x.deb"
    bad.write_bytes(b"hello")
    with pytest.raises(data.DataError, match="not a Debian package"):
        data.build(bad, tmp_path / "out.txt")


def test_committed_slice_matches_its_manifest():
    m = data.read_manifest(SLICE)
    blob = SLICE.read_bytes()
    assert m["sha256"] == data.sha256(SLICE) and m["bytes"] == len(blob)
    assert 200_000 < len(blob) <= 256_000
    assert blob[m["val"]["offset"] - 1] == data.SEP and m["val"]["documents"] >= 1
    assert m["subset_of"]["bytes"] > 1_000_000_000   # cut from the full corpus


def test_subset_pack_unpack_round_trip(corpus, tmp_path):
    src, m = corpus
    packed = data.pack(src, tmp_path / "small.txt.xz", megabytes=0.001)
    assert packed["val"]["documents"] == m["val"]["documents"]   # the whole validation split
    assert 0 < packed["bytes"] - packed["val"]["bytes"] <= 1000
    out = data.unpack(tmp_path / "small.txt.xz", tmp_path / "elsewhere")
    assert data.sha256(out) == packed["sha256"]
    assert data.read_manifest(out) == packed
    # every document of the subset is a document of the source, in the source's order
    src_docs = src.read_bytes().split(b"\x1e")
    sub_docs = out.read_bytes().split(b"\x1e")
    assert [src_docs.index(d) for d in sub_docs] == sorted(src_docs.index(d) for d in sub_docs)


def test_unpack_rejects_corrupt_archives(corpus, tmp_path):
    src, _ = corpus
    data.pack(src, tmp_path / "c.txt.xz", megabytes=0.001)
    (tmp_path / "c.txt.xz").write_bytes((tmp_path / "c.txt.xz").read_bytes()[:50])
    with pytest.raises(data.DataError, match="corrupt or truncated"):
        data.unpack(tmp_path / "c.txt.xz")


def test_loader_reads_packed_files_directly(corpus, tmp_path):
    src, _ = corpus
    data.pack(src, tmp_path / "d.txt.xz", megabytes=0.001)
    d = data.ByteData(tmp_path / "d.txt.xz")
    assert d.path == tmp_path / "d.txt" and len(d) == data.read_manifest(d.path)["bytes"]


def test_windows_are_seeded_per_step_and_rank_and_never_touch_validation():
    d = data.ByteData(SLICE)
    T, B = 64, 16
    a = d.train_positions(5, B, T, seed=42)
    assert np.array_equal(a, d.train_positions(5, B, T, seed=42))
    assert not np.array_equal(a, d.train_positions(6, B, T, seed=42))
    assert not np.array_equal(a, d.train_positions(5, B, T, seed=42, rank=1))
    assert not np.array_equal(a, d.train_positions(5, B, T, seed=43))
    pos = np.concatenate([d.train_positions(s, B, T, 42) for s in range(300)])
    assert pos.min() >= 0 and pos.max() + T < d.val_start   # last byte of a window < val_start
    assert pos.max() > 0.9 * d.val_start                     # and they cover the region
    w = d.batch(5, B, T, 42)
    assert w.shape == (B, T + 1) and w.dtype == np.uint8
    assert bytes(w[0]) == SLICE.read_bytes()[a[0]:a[0] + T + 1]


def test_validation_tiles_the_held_out_split_without_overlap():
    d = data.ByteData(SLICE)
    T = 64
    v = d.val_positions(T)
    assert len(v) == d.val_tiles(T) and v[0] == d.val_start and np.all(np.diff(v) == T)
    assert v[-1] + T < len(d) <= v[-1] + 2 * T + 1          # the tiles reach the end
    sub = d.val_positions(T, 10)                            # evenly spaced tiles, no seed
    assert len(sub) == 10 and set(sub) <= set(v) and (sub[0], sub[-1]) == (v[0], v[-1])
    assert np.array_equal(sub, d.val_positions(T, 10))
    assert np.array_equal(d.val_positions(T, 10 ** 6), v)
    assert [len(b) for b in d.val_batches(T, 4, 10)] == [4, 4, 2]
    assert d.val_sources() == [("all", d.val_start, len(d))]
    names, src = d.target_sources(v[:3], T)
    assert names == ["all"] and src.shape == (3, T) and (src == 0).all()


def test_raw_file_without_manifest_holds_out_its_last_percent(tmp_path):
    f = tmp_path / "raw.bin"
    f.write_bytes(bytes(range(256)) * 400)
    d = data.ByteData(f)
    assert d.manifest is None and d.val_start == len(d) - len(d) // 100


@pytest.mark.parametrize("content,match", [(None, "does not exist"), (b"", "is empty"),
                                           (b"abc" * 10, "fewer than one window")])
def test_loader_errors(tmp_path, content, match):
    f = tmp_path / "f.txt"
    if content is not None:
        f.write_bytes(content)
    with pytest.raises(data.DataError, match=match):
        data.ByteData(f).batch(0, 2, 64, 0)


def test_manifest_size_mismatch_is_an_error(tmp_path):
    f = tmp_path / "f.txt"
    f.write_bytes(b"x" * 1000)
    data.manifest_path(f).write_text(json.dumps({"bytes": 999, "val": {"offset": 900}}))
    with pytest.raises(data.DataError, match="manifest says"):
        data.ByteData(f)


def test_batches_prefetch_the_same_windows_and_resume_mid_stream():
    d = data.ByteData(SLICE)
    straight = data.Batches(d, 4, 32, seed=7)
    first = [(s, x.clone()) for (s, x), _ in zip(straight, range(6))]
    resumed = data.Batches(d, 4, 32, seed=7, start_step=3)
    later = [(s, x.clone()) for (s, x), _ in zip(resumed, range(3))]
    assert [s for s, _ in first] == list(range(6)) and [s for s, _ in later] == [3, 4, 5]
    for (s, x), (_, y) in zip(first[3:], later):
        assert torch.equal(x, y) and x.dtype == torch.long
        assert torch.equal(x, torch.from_numpy(d.batch(s, 4, 32, 7)).long())


def test_batches_hand_loader_errors_to_the_consumer(tmp_path):
    f = tmp_path / "tiny.txt"
    f.write_bytes(b"abc" * 10)
    b = data.Batches(data.ByteData(f), 2, 64, seed=0)
    with pytest.raises(data.DataError):
        next(iter(b))


def test_cli_slice_and_info(corpus, tmp_path, capsys):
    src, _ = corpus
    out = tmp_path / "slice.txt"
    assert cli(["data", "--corpus", str(src), "--slice", "40K", "--out", str(out)]) == 0
    m = data.read_manifest(out)
    assert m["bytes"] <= 40000 and m["val"]["documents"] >= 1
    assert cli(["data", "--info", str(out)]) == 0
    assert json.loads(capsys.readouterr().out.split("\n", 1)[1])["val_start"] == m["val"]["offset"]


def test_cli_builds_the_linux_corpus_by_name(fake_deb, corpus, tmp_path, capsys):
    out = tmp_path / "linux.txt"
    assert cli(["data", "--name", "linux-6.1", "--deb", str(fake_deb), "--out", str(out)]) == 0
    assert "from linux-source-6.1 6.1.0-1" in capsys.readouterr().out
    assert data.read_manifest(out)["sha256"] == corpus[1]["sha256"]


def test_pack_in_parts_joins_back(corpus, tmp_path):
    src, _ = corpus
    m = data.pack(src, tmp_path / "p.txt.xz", megabytes=0.01, part_mb=0.0001)
    assert len(m["xz_parts"]) > 1 and not (tmp_path / "p.txt.xz").exists()
    assert all((tmp_path / n).stat().st_size <= 0.0001 * 2**20 for n in m["xz_parts"])
    assert data.sha256(data.ByteData(tmp_path / "p.txt.xz").path) == m["sha256"]
    (tmp_path / "p.txt").unlink()
    (tmp_path / "p.txt.xz").unlink()
    (tmp_path / m["xz_parts"][-1]).unlink()
    with pytest.raises(data.DataError, match="missing"):
        data.unpack(tmp_path / "p.txt.xz")


def test_repart_cuts_the_parts_anew(corpus, tmp_path, capsys):
    src, _ = corpus
    m = data.pack(src, tmp_path / "p.txt.xz", megabytes=0.01, part_mb=0.00005)
    part_mb = m["xz_bytes"] / 2.5 / 2**20  # three parts
    assert cli(["data", "--repart", str(tmp_path / "p.txt.xz"), "--part-mb", f"{part_mb:.8f}"]) == 0
    names = data.read_manifest(tmp_path / "p.txt.xz")["xz_parts"]
    assert "3 parts" in capsys.readouterr().out and len(names) == 3 < len(m["xz_parts"])
    assert sorted(p.name for p in tmp_path.glob("p.txt.xz.*")) == names
    assert data.sha256(data.ByteData(tmp_path / "p.txt.xz").path) == m["sha256"]


def test_cli_collects_the_parts_into_a_folder_that_unpacks(corpus, tmp_path, capsys):
    src, _ = corpus
    m = data.pack(src, tmp_path / "p.txt.xz", megabytes=0.01, part_mb=0.00005)
    dest = tmp_path / "dest"
    assert cli(["data", "--collect", str(tmp_path / "p.txt.xz"), "--out", str(dest)]) == 0
    assert f"{m['xz_bytes']:,} bytes" in capsys.readouterr().out
    assert sorted(p.name for p in dest.iterdir()) == sorted([*m["xz_parts"], "p.txt.json"])
    assert data.sha256(data.unpack(dest / "p.txt.xz")) == m["sha256"]
    (tmp_path / m["xz_parts"][1]).unlink()
    assert cli(["data", "--collect", str(tmp_path / "p.txt.xz"), "--out", str(tmp_path / "d2"),
                "--wait", "0"]) == 1
    assert f"of {m['xz_bytes']} bytes of the parts" in capsys.readouterr().out


def test_cli_reports_missing_apt_get(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(data.shutil, "which", lambda name: None)
    monkeypatch.setattr(data, "CACHE", tmp_path)
    assert cli(["data", "--out", str(tmp_path / "x.txt")]) == 1
    assert "not Debian-based" in capsys.readouterr().out


def test_same_windows_in_the_same_order_for_every_loader_with_the_same_seed():
    """The same-windows guarantee: windows depend only on the file, seed, rank, step, batch, T."""
    runs = []
    for _ in range(2):
        b = data.Batches(data.ByteData(data.MIX_SLICE), 4, 64, seed=42)
        runs.append([x.clone() for (_, x), _ in zip(b, range(10))])
    assert all(torch.equal(x, y) for x, y in zip(*runs))
    other = data.Batches(data.ByteData(data.MIX_SLICE), 4, 64, seed=43)
    first = next(iter(other))[1]
    assert not torch.equal(first, runs[0][0])


def test_compress_writes_streams_that_read_back_as_one(tmp_path):
    """A packed corpus is several xz streams (data.compress): lzma reads them back as the whole
    text, and the bytes do not depend on the thread count."""
    import lzma
    src = tmp_path / "t.txt"
    src.write_bytes(bytes(np.random.default_rng(0).integers(0, 40, 10_000, dtype=np.uint8)))
    outs = []
    for threads in (1, 3):
        out = tmp_path / f"t{threads}.xz"
        data.compress(src, out, block=1_000, threads=threads)
        outs.append(out.read_bytes())
        assert lzma.decompress(outs[-1]) == src.read_bytes()
    assert outs[0] == outs[1] and outs[0].count(b"\xfd7zXZ\x00") == 10
    sizes = data.compress(src, tmp_path / "t.xz", block=1_000, threads=2)
    assert len(sizes) == 10 and sum(sizes) == len(outs[0])
    for streams in (sizes, None, sizes[:-1]):  # in parallel; in one pass; sizes that do not add up
        data.decompress(tmp_path / "t.xz", tmp_path / "back.txt", streams, threads=3)
        assert (tmp_path / "back.txt").read_bytes() == src.read_bytes()
    broken = bytearray(outs[0])
    broken[sizes[0] + 40] ^= 0xFF  # inside the second stream
    (tmp_path / "bad.xz").write_bytes(bytes(broken))
    with pytest.raises(lzma.LZMAError):
        data.decompress(tmp_path / "bad.xz", tmp_path / "back.txt", sizes)
