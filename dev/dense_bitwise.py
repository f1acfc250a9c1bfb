"""The dense kernels before and after a change, bit for bit: a self-contained check program.

    python dev/dense_bitwise.py --before .cache/before            # on a GPU (sm_90)
    python dev/dense_bitwise.py --before .cache/before --sass     # anywhere with nvcc

`--before` is a folder holding an earlier tree's `lib/csrc` (for example
`git archive a62a39d lib/csrc | tar -x -C .cache/before`), whose one extension exposes
`dense_forward(wx, z, w_h, b, h0, out, h_all, epilogue, persistent)` and
`dense_backward(w_h, h_all, z, d_out, d_hT, dv, dz, dh0, epilogue, persistent)`.

GPU mode builds it as the extension `elman_before` and the current `elman_dense`, runs both on
identical random inputs (never zeros) with the tanh-silu-gate epilogue (E0, E1), forward and
backward, on the persistent path (the cluster design at 8 and 16 batch columns, one cluster
and several, two waves at B = 130, D = 256..1024; the grid design at D = 2048 with 8, 32 and 64
columns) and on the per-step path (fp32 and bf16), compares every output bit for bit, prints a
table, writes one parity record per case and exits non-zero on any difference.

SASS mode (no GPU) compiles both trees' persistent and per-step kernels for sm_90a and
compares, kernel by kernel, the ptxas resource report (registers, shared memory, stack,
spills) and the SASS instructions (cuobjdump; names and addresses dropped, and with
kernel-parameter offsets masked as a second count, since the parameter structs changed).
"""
from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "lib"))

NVCC_FLAGS = ["-std=c++17", "-O3", "--expt-relaxed-constexpr",
              "-gencode=arch=compute_90a,code=sm_90a"]
EPILOGUE = "tanh_silu_gate"
EPILOGUE_STRUCT = "TanhSiluGate"

# (T, B, D): cluster design at 8 columns (B <= 8) and 16 (B = 16, 64), one cluster and
# several, two waves (B = 130, D = 1024), every D; grid design at 8, 32 and 64 columns.
PERSISTENT = [(7, 3, 256), (6, 8, 256), (9, 5, 512), (5, 16, 512), (6, 64, 512), (5, 8, 768),
              (5, 20, 768), (9, 4, 1024), (7, 16, 1024), (5, 64, 1024), (4, 130, 1024),
              (4, 5, 2048), (4, 20, 2048), (4, 64, 2048)]
STEPS = [(5, 3, 100), (4, 16, 512), (3, 5, 2048)]


# ---- SASS mode --------------------------------------------------------------------------
KERNEL = re.compile(r"(forward_kernel|backward_kernel|grid_forward|grid_backward|step_forward|"
                    r"step_backward)")


def kernel_key(mangled: str) -> str | None:
    """A name that survives the move: kernel, its integer template arguments, element type
    (per-step kernels) and trace flag. Only the kernels of E0/E1's epilogue (the struct named
    TanhSiluGate in both trees) are compared; the other epilogues of the table have none before."""
    m = KERNEL.search(mangled)
    if not m or EPILOGUE_STRUCT not in mangled:
        return None
    rest = mangled[m.end():].split("Ev")[0]  # template arguments only, not the parameter type
    ints = re.findall(r"Li(\d+)E", rest)
    if m[1].startswith("grid") and len(ints) == 2:  # the grid kernels' width: 2048 or 0 (any D)
        ints = ints[:1] if ints[1] == "2048" else [ints[0], "anyD"]
    bools = re.findall(r"Lb(\d)E", rest)[1:]  # the first is the epilogue's kApprox
    dtype = "bf16" if "nv_bfloat16" in rest else ("f32" if m[1].startswith("step") else "")
    return ":".join([m[1], *ints, dtype, *("trace" if b == "1" else "" for b in bools)]).rstrip(":")


def ptxas_report(text: str) -> dict[str, str]:
    """{kernel key: 'N registers, M bytes smem, S stack, spills'} from `-Xptxas -v`."""
    out: dict[str, str] = {}
    for block in re.split(r"ptxas info\s+: Compiling entry function ", text)[1:]:
        name = block.split("'")[1]
        key = kernel_key(name)
        regs = re.search(r"Used (\d+) registers", block)
        smem = re.search(r"(\d+) bytes smem", block)
        frame = re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads",
                          block)
        if key and regs:
            out[key] = (f"{regs[1]} regs, {smem[1] if smem else 0} B smem, "
                        f"{frame[1] if frame else '?'} B stack, "
                        f"spills {frame[2] if frame else '?'}/{frame[3] if frame else '?'}")
    return out


def sass(cubin: Path, cuobjdump: str) -> dict[str, list[str]]:
    """{kernel key: instruction lines} with addresses, encodings and labels dropped."""
    text = subprocess.run([cuobjdump, "-sass", str(cubin)], capture_output=True, text=True,
                          check=True).stdout
    out: dict[str, list[str]] = {}
    key = None
    for line in text.splitlines():
        f = re.match(r"\s*Function : (\S+)", line)
        if f:
            key = kernel_key(f[1])
            if key:
                out[key] = []
            continue
        ins = re.match(r"\s*/\*[0-9a-f]{4,}\*/\s+(.*?);", line)
        if key and ins:
            out[key].append(re.sub(r"\s+", " ", ins[1]).strip())
    return out


def masked(lines: list[str]) -> list[str]:
    return [re.sub(r"c\[0x0\]\[0x[0-9a-f]+\]", "c[0x0][P]", s) for s in lines]


def compile_tree(csrc: Path, sources: list[str], out: Path, defines: list[str]) -> tuple[dict, dict]:
    reports: dict[str, str] = {}
    code: dict[str, list[str]] = {}
    cuobjdump = shutil.which("cuobjdump") or "cuobjdump"
    for src in sources:
        cubin = out / (src.replace("/", "_") + ".cubin")
        proc = subprocess.run(["nvcc", "-cubin", *NVCC_FLAGS, "-Xptxas", "-v", *defines,
                               "-I", str(csrc), str(csrc / src), "-o", str(cubin)],
                              capture_output=True, text=True)
        if proc.returncode:
            raise SystemExit(f"nvcc failed on {csrc / src}:\n{proc.stderr[-4000:]}")
        reports.update(ptxas_report(proc.stdout + proc.stderr))
        code.update(sass(cubin, cuobjdump))
    return reports, code


def sass_mode(before: Path) -> int:
    if not shutil.which("nvcc") or not shutil.which("cuobjdump"):
        print("needs nvcc and cuobjdump on PATH (pip: nvidia-cuda-cuobjdump)")
        return 2
    with tempfile.TemporaryDirectory() as tmp:
        a, b = Path(tmp, "before"), Path(tmp, "after")
        a.mkdir(), b.mkdir()
        csrc = before / "lib" / "csrc"
        if (csrc / "dense" / "persistent.cu").exists():  # a tree with the family layout
            old = compile_tree(csrc, ["dense/persistent.cu", "dense/steps.cu"], a, ["-DELMAN_TRACE"])
        else:
            old = compile_tree(csrc, ["dense_persistent.cu", "dense_grid.cu", "dense_steps.cu"], a, [])
        new = compile_tree(ROOT / "lib" / "csrc", ["dense/persistent.cu", "dense/steps.cu"], b,
                           ["-DELMAN_TRACE"])
    keys = sorted((set(old[0]) | set(new[0])) - {None})
    same_res = same_sass = same_masked = 0
    print(f"{'kernel':34} {'before':44} {'after':44} sass")
    for k in keys:
        r0, r1 = old[0].get(k, "-"), new[0].get(k, "-")
        s0, s1 = old[1].get(k), new[1].get(k)
        verdict = ("missing" if s0 is None or s1 is None else "identical" if s0 == s1
                   else "identical but parameter offsets" if masked(s0) == masked(s1)
                   else f"differs ({len(s0)} vs {len(s1)} instructions)")
        same_res += r0 == r1
        same_sass += verdict == "identical"
        same_masked += verdict.startswith("identical")
        print(f"{k:34} {r0:44} {r1:44} {verdict}")
    both = sum(k in old[0] and k in new[0] for k in keys)
    print(f"\n{len(keys)} kernels, {both} in both trees: resources equal {same_res}, SASS "
          f"identical {same_sass}, identical up to parameter offsets {same_masked}")
    return 0 if same_res == both else 1


# ---- GPU mode ---------------------------------------------------------------------------
def build_before(before: Path, verbose: bool):
    import torch
    from torch.utils.cpp_extension import load
    csrc = before / "lib" / "csrc"
    cc = torch.cuda.get_device_capability()
    arch = ["-gencode=arch=compute_90a,code=sm_90a"] if cc == (9, 0) else \
        [f"-gencode=arch=compute_{cc[0]}{cc[1]},code=sm_{cc[0]}{cc[1]}"]
    out = before / "build"
    out.mkdir(exist_ok=True)
    return load(name="elman_before", sources=sorted(str(p) for p in (*csrc.glob("*.cpp"), *csrc.glob("*.cu"))),
                build_directory=str(out), extra_cflags=["-O3", "-std=c++17"],
                extra_cuda_cflags=["-O3", "-std=c++17", "--expt-relaxed-constexpr", "-lineinfo", *arch],
                extra_ldflags=["-lcublas"], verbose=verbose)


def inputs(T: int, B: int, D: int, dtype, seed: int) -> dict:
    import torch
    g = torch.Generator(device="cuda").manual_seed(seed)
    r = lambda *s, scale=1.0: (scale * torch.randn(*s, device="cuda", generator=g)).to(dtype)
    w = torch.randn(D, D, device="cuda", generator=g, dtype=torch.float64)
    w = (w * (0.99 / torch.linalg.matrix_norm(w, ord=2))).to(dtype)
    return {"wx": r(T, B, D), "z": r(T, B, D), "w_h": w, "b": r(D, scale=0.1),
            "h0": r(B, D, scale=0.5), "d_out": r(T, B, D), "d_hT": r(B, D)}


def run_before(ext, s: dict, persistent: bool) -> dict:
    import torch
    T, B, D = s["wx"].shape
    nan = lambda *shape: torch.full(shape, float("nan"), device="cuda", dtype=s["wx"].dtype)
    out, h_all = nan(T, B, D), nan(T + 1, B, D)
    ext.dense_forward(s["wx"], s["z"], s["w_h"], s["b"], s["h0"], out, h_all, 0, persistent)
    dv, dz, dh0 = nan(T, B, D), nan(T, B, D), nan(B, D)
    ext.dense_backward(s["w_h"], h_all, s["z"], s["d_out"], s["d_hT"], dv, dz, dh0, 0, persistent)
    torch.cuda.synchronize()
    return {"out": out, "h_all": h_all, "dv": dv, "dz": dz, "dh0": dh0}


def run_after(ext, s: dict, persistent: bool) -> dict:
    import torch
    T, B, D = s["wx"].shape
    eid = ext.epilogues()[EPILOGUE]["id"]
    nan = lambda *shape: torch.full(shape, float("nan"), device="cuda", dtype=s["wx"].dtype)
    out, h_all = nan(T, B, D), nan(T + 1, B, D)
    ext.forward(eid, s["wx"], [s["z"]], s["w_h"], s["b"], s["h0"], out, h_all, persistent)
    dv, dz, dh0 = nan(T, B, D), nan(T, B, D), nan(B, D)
    ext.backward(eid, s["w_h"], h_all, [s["z"]], s["d_out"], s["d_hT"], dv, [dz], dh0, persistent)
    torch.cuda.synchronize()
    return {"out": out, "h_all": h_all, "dv": dv, "dz": dz, "dh0": dh0}


def gpu_mode(before: Path, label: str, write: bool, verbose: bool) -> int:
    import torch
    from elman.core import extension, records
    if not torch.cuda.is_available():
        print("GPU mode needs a CUDA device; --sass runs without one")
        return 2
    old, new = build_before(before, verbose), extension.load("dense", verbose=verbose)
    cases = [("persistent", torch.bfloat16, s) for s in PERSISTENT] + \
            [("steps", dt, s) for dt in (torch.float32, torch.bfloat16) for s in STEPS]
    recs, failed = [], 0
    print(f"{'path':10} {'dtype':9} {'T':>3} {'B':>4} {'D':>5}  {'design':8} result")
    for i, (path, dtype, (T, B, D)) in enumerate(cases):
        s = inputs(T, B, D, dtype, seed=1000 + i)
        design = new.persistent_plan(B, D, False)["design"] if path == "persistent" else "steps"
        a, b = run_before(old, s, path == "persistent"), run_after(new, s, path == "persistent")
        diff = {k: int((a[k].view(torch.int16 if dtype == torch.bfloat16 else torch.int32) !=
                        b[k].view(torch.int16 if dtype == torch.bfloat16 else torch.int32)).sum())
                for k in a}
        unwritten = {k: int(b[k].isnan().sum()) for k in b}
        equal = not any(diff.values()) and not any(unwritten.values())
        failed += not equal
        what = "bitwise equal" if equal else f"DIFFERENT elements {diff}, NaN {unwritten}"
        print(f"{path:10} {str(dtype)[6:]:9} {T:>3} {B:>4} {D:>5}  {design:8} {what}", flush=True)
        recs.append(records.make(
            "parity", "dense:" + EPILOGUE, f"cuda:{path} bitwise vs {label}",
            {"T": T, "B": B, "D": D, "dtype": str(dtype)[6:], "design": design},
            {"bitwise_equal": equal, "different_elements": diff, "unwritten": unwritten,
             "passed": equal}))
    if write:
        print("records:", records.write(recs))
    print(f"\n{len(cases) - failed} of {len(cases)} cases bitwise equal")
    return 1 if failed else 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--before", type=Path, default=ROOT / ".cache" / "before",
                   help="folder holding the earlier tree's lib/csrc")
    p.add_argument("--label", default="a62a39d",
                   help="the earlier tree's commit, for the records' impl ('cuda:persistent bitwise vs LABEL')")
    p.add_argument("--sass", action="store_true", help="compare ptxas resources and SASS (no GPU)")
    p.add_argument("--no-records", action="store_true", help="do not write parity records")
    p.add_argument("--verbose", action="store_true")
    args = p.parse_args()
    if not (args.before / "lib" / "csrc").is_dir():
        print(f"{args.before}/lib/csrc is missing: extract it with "
              f"`git archive <commit> lib/csrc | tar -x -C {args.before}`")
        return 2
    if args.sass:
        return sass_mode(args.before)
    return gpu_mode(args.before, args.label, not args.no_records, args.verbose)


if __name__ == "__main__":
    sys.exit(main())
