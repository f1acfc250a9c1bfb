"""Where the default corpus's documents come from: Debian packages the project can install
on a fresh machine (`apt-get download`), read without installing them. Chapter:
book/chapters/training_protocol.ipynb.

A `Source` is one named part of the corpus (a code base, or a kind of prose) made of one
or more packages; each package lists the member paths it contributes (`fnmatch` patterns
on the path inside the package, archives opened). `package_files` walks a package: a
`.deb` through `dpkg-deb --fsys-tarfile`, a folder or a tarball directly; the archives a package names
(a source tarball, a JDK's `src.zip`) are opened, `.gz`/`.dz` files decompressed (at most
GUNZIP_LIMIT bytes) and HTML reduced to its text, so that a document is the text a person
wrote. Other archives, such as compressors' test data, stay single files and are dropped
by the cleaning rules.
"""
from __future__ import annotations

import hashlib
import io
import shutil
import subprocess
import tarfile
import zipfile
import zlib
from dataclasses import dataclass
from fnmatch import fnmatch
from html.parser import HTMLParser
from pathlib import Path
from typing import Iterator

GUNZIP_LIMIT = 256 * 2**20
MEMBER_LIMIT = 1 << 30
TAR_SUFFIXES = (".tar", ".tar.gz", ".tgz", ".tar.xz", ".tar.bz2", ".tar.zst")
EVERYWHERE_EXCLUDED = ("*.po", "*.pot", "*/ChangeLog*", "*.svg", "*.map", "*/testdata/*")


class SourceError(RuntimeError):
    """A package cannot be read."""


@dataclass(frozen=True)
class Package:
    name: str
    include: tuple[str, ...] = ("*",)
    chunk: int = 0  # > 0: a file longer than this is cut into documents of about this size
    archives: tuple[str, ...] = ()  # the archives in the package whose members are documents


def chunks(blob: bytes, size: int) -> list[bytes]:
    """blob cut into pieces of at most about size bytes, at blank lines where there are some
    (else at line ends); every byte kept, in order."""
    out, start = [], 0
    while len(blob) - start > size:
        cut = blob.rfind(b"\n\n", start, start + size)
        cut = cut + 2 if cut > start else blob.rfind(b"\n", start, start + size) + 1
        if cut <= start:
            cut = start + size
        out.append(blob[start:cut])
        start = cut
    out.append(blob[start:])
    return out


@dataclass(frozen=True)
class Source:
    name: str
    kind: str  # "code" or "prose"
    packages: tuple[Package, ...]
    exclude: tuple[str, ...] = ()
    about: str = ""


SOURCE_TARBALLS = ("usr/src/*.tar.xz", "usr/src/*/*.tar.xz")
NESTED = ("*.tar.xz/*",)
CHUNK = 65536
SOURCES: tuple[Source, ...] = (
    Source("linux", "code", (Package("linux-source-6.1", NESTED, archives=SOURCE_TARBALLS),),
           ("*/drivers/gpu/drm/amd/include/asic_reg/*", "*/firmware/*"),
           "the Linux 6.1 kernel tree (C), without AMD's generated register headers"),
    Source("gcc", "code", (Package("gcc-12-source", NESTED, archives=SOURCE_TARBALLS),), (),
           "GCC 12 (C, C++, Ada, Fortran, Go front ends and runtime libraries)"),
    Source("glibc", "code", (Package("glibc-source", NESTED, archives=SOURCE_TARBALLS),), ("*/localedata/*",),
           "the GNU C library 2.36 (C, assembly)"),
    Source("openjdk", "code", (Package("openjdk-17-source", ("*src.zip/*.java",), archives=("*/lib/src.zip",)),), (),
           "the OpenJDK 17 class library (Java)"),
    Source("go", "code", (Package("golang-1.19-src", ("*/src/*.go", "*/src/*.s")),), (),
           "the Go 1.19 standard library (Go)"),
    Source("emacs-lisp", "code", (Package("emacs-el", ("*.el",)),), (),
           "Emacs 28's Lisp sources (Emacs Lisp)"),
    Source("manuals", "prose", (Package("python3.11-doc", ("*/_sources/*",)),
                                Package("perl-doc", ("*.pod",), CHUNK),
                                Package("debian-handbook", ("*/en-US/*.html",)),
                                Package("gnu-standards", ("*.html",), CHUNK)), (),
           "the Python 3.11 and Perl manuals, the Debian Administrator's Handbook, GNU coding standards"),
    Source("man-pages", "prose", (Package("manpages", ("*/man/*",)),
                                  Package("manpages-dev", ("*/man/*",))), (),
           "the Linux man pages (roff)"),
    Source("books", "prose", (Package("dict-gcide", ("*.dict",), CHUNK),
                              Package("bible-kjv-text", ("*/bible.data",), CHUNK),
                              Package("fortunes-min", ("*/fortunes/*",))), (),
           "the GNU Collaborative International Dictionary of English, the King James Bible, fortunes"),
)


class _Text(HTMLParser):
    SKIP = {"script", "style", "head"}

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.parts: list[str] = []
        self.skipping = 0

    def handle_starttag(self, tag, attrs):
        self.skipping += tag in self.SKIP

    def handle_endtag(self, tag):
        self.skipping -= tag in self.SKIP and self.skipping > 0

    def handle_data(self, data):
        if not self.skipping:
            self.parts.append(data)


def html_text(blob: bytes) -> bytes:
    """The text of an HTML page, blank-line runs collapsed."""
    parser = _Text()
    parser.feed(blob.decode("utf-8", errors="replace"))
    lines = [line.rstrip() for line in "".join(parser.parts).splitlines()]
    out, blank = [], False
    for line in lines:
        if line or not blank:
            out.append(line)
        blank = not line
    return "\n".join(out).strip().encode()


def gunzip(blob: bytes, limit: int = GUNZIP_LIMIT) -> bytes | None:
    """The decompressed bytes of a gzip file (all members), or None when it is not gzip or
    decompresses to more than limit bytes (test data of compressors holds gzip bombs)."""
    out, rest = [], blob
    try:
        while rest:
            d = zlib.decompressobj(16 + zlib.MAX_WBITS)
            out.append(d.decompress(rest, limit - sum(map(len, out)) + 1))
            if d.unconsumed_tail or sum(map(len, out)) > limit or not d.eof:
                return None
            rest = d.unused_data.lstrip(b"\0")
    except zlib.error:
        return None
    return b"".join(out)


def expand(name: str, blob: bytes, archives: tuple[str, ...] = ()) -> Iterator[tuple[str, bytes]]:
    """The documents of one file: the members of an archive whose path matches `archives`
    (archives inside it, like every other archive, are files), decompressed .gz/.dz files,
    the text of HTML pages. An archive that cannot be read is one (binary) file."""
    low = name.lower()
    nested = not any(fnmatch(name, a) for a in archives)
    try:
        if low.endswith(TAR_SUFFIXES) and not nested:
            with tarfile.open(fileobj=io.BytesIO(blob), mode="r|*") as tar:
                for m in tar:
                    if m.isfile():
                        yield from expand(f"{name}/{m.name.lstrip('./')}", _read(tar, m))
            return
        if low.endswith(".zip") and not nested:
            with zipfile.ZipFile(io.BytesIO(blob)) as z:
                for info in sorted(z.infolist(), key=lambda i: i.filename):
                    if not info.is_dir():
                        yield from expand(f"{name}/{info.filename}",
                                          z.read(info) if info.file_size <= MEMBER_LIMIT else b"")
            return
    except (tarfile.TarError, zipfile.BadZipFile, EOFError, OSError):
        yield name, blob
        return
    if low.endswith((".gz", ".dz")):
        inner = gunzip(blob)
        if inner is None:
            yield name, blob
            return
        yield from expand(name[:-3], inner)
    elif low.endswith((".html", ".htm")):
        yield name, html_text(blob)
    else:
        yield name, blob


def _read(tar: tarfile.TarFile, m: tarfile.TarInfo) -> bytes:
    """A member's bytes; empty for a member declared larger than MEMBER_LIMIT (archivers'
    test data declares huge sparse files)."""
    return tar.extractfile(m).read() if m.size <= MEMBER_LIMIT else b""


def package_files(path: Path, archives: tuple[str, ...] = ()) -> Iterator[tuple[str, bytes]]:
    """(path inside the package, bytes) for every file of a package (a .deb, a folder or a
    tarball) in archive order (a folder: sorted), with the members of the archives that
    match `archives` in place of those archives."""
    path = Path(path)
    if path.is_dir():
        for f in sorted(p for p in path.rglob("*") if p.is_file()):
            yield from expand(f.relative_to(path).as_posix(), f.read_bytes(), archives)
        return
    if path.suffix == ".deb":
        if shutil.which("dpkg-deb") is None:
            raise SourceError(f"reading {path.name} needs dpkg-deb (Debian's package `dpkg`); "
                              f"build the corpus on a Debian-based machine and carry it "
                              f"(`elman data --pack MB --part-mb 40`)")
        proc = subprocess.Popen(["dpkg-deb", "--fsys-tarfile", str(path)], stdout=subprocess.PIPE)
        try:
            with tarfile.open(fileobj=proc.stdout, mode="r|") as tar:
                for m in tar:
                    if m.isfile():
                        yield from expand(m.name.lstrip("./"), _read(tar, m), archives)
        finally:
            proc.stdout.close()
            if proc.wait() != 0:
                raise SourceError(f"`dpkg-deb --fsys-tarfile {path}` failed (exit {proc.returncode})")
        return
    with tarfile.open(path, mode="r|*") as tar:
        for m in tar:
            if m.isfile():
                yield from expand(m.name.lstrip("./"), _read(tar, m), archives)


def package_info(path: Path) -> dict:
    """Name, version, file name and sha256 of a package (of a folder: of its sorted files)."""
    path = Path(path)
    h = hashlib.sha256()
    if path.is_dir():
        for f in sorted(p for p in path.rglob("*") if p.is_file()):
            h.update(f.relative_to(path).as_posix().encode() + b"\0" + f.read_bytes())
        return {"package": path.name, "version": None, "file": path.name, "sha256": h.hexdigest()}
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 24), b""):
            h.update(block)
    info = {"package": path.name.split("_")[0], "version": None, "file": path.name,
            "sha256": h.hexdigest()}
    if path.suffix == ".deb":
        out = subprocess.run(["dpkg-deb", "-f", str(path), "Package", "Version"],
                             capture_output=True, text=True, check=True).stdout
        fields = dict(line.split(": ", 1) for line in out.splitlines() if ": " in line)
        info.update(package=fields.get("Package", info["package"]), version=fields.get("Version"))
    return info


def included(name: str, package: Package, source: Source) -> str | None:
    """None if the file is one of the package's documents, else why not ('path')."""
    if not any(fnmatch(name, p) for p in package.include):
        return "not-included"
    if any(fnmatch(name, p) for p in source.exclude + EVERYWHERE_EXCLUDED):
        return "path"
    return None
