"""`elman warm` on the CPU: the worker's share of a kernel's configs, the patch of Triton's
Autotuner (on real `triton.autotune`d kernels, FLA's subclass among them, and run in
Triton's interpreter), its undoing, the job list against the calls of the later stages,
and the parent's reporting of a failing worker."""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import triton
import triton.language as tl
from triton.runtime.autotuner import Autotuner

import torch

from elman.harness import bench
from elman import registry
from elman.harness import warm as tritonwarm
from elman.baselines import gdn

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = [triton.Config({"BLOCK": 16 * (k + 1)}, num_warps=2 ** (k % 3)) for k in range(5)]


@triton.autotune(configs=CONFIGS, key=["n"])
@triton.jit
def _kernel(x, n, BLOCK: tl.constexpr):
    tl.store(x + tl.arange(0, BLOCK), tl.zeros((BLOCK,), tl.float32), mask=tl.arange(0, BLOCK) < n)


def _autotuner(obj) -> Autotuner:
    while not isinstance(obj, Autotuner):
        obj = obj.fn
    return obj


# ---- the share ---------------------------------------------------------------------------------
@pytest.mark.parametrize("n", [1, 3, 16])
@pytest.mark.parametrize("m", [1, 2, 5, 16, 17, 48])
def test_workers_together_run_every_config_and_each_worker_at_least_one(n, m):
    configs = list(range(m))
    shares = [tritonwarm.share(configs, i, n) for i in range(n)]
    assert all(shares) and sorted(set(sum(shares, []))) == configs
    if m <= n:    # one config each: config i mod m
        assert shares == [[configs[i % m]] for i in range(n)]
    else:         # every config exactly once
        assert sorted(sum(shares, [])) == configs
        assert max(map(len, shares)) == -(-m // n)


# ---- the patch on real autotuned kernels -------------------------------------------------------
def _class_state():
    return {name: Autotuner.__dict__[name] for name in ("prune_configs", "do_bench", "run")}


@pytest.mark.parametrize("i,n", [(0, 3), (1, 3), (4, 3), (2, 16)])
def test_patched_prune_keeps_the_workers_config_and_is_undone(i, n):
    tuner = _autotuner(_kernel)
    before = _class_state()
    assert tuner.prune_configs({}) == CONFIGS
    expected = [CONFIGS[i % len(CONFIGS)]] if len(CONFIGS) <= n else CONFIGS[i::n]
    with tritonwarm.worker_share(i, n):
        assert tuner.prune_configs({}) == expected
        assert tuner.cache_results is False           # no autotune results on disk
        assert tuner.do_bench is tritonwarm.run_once   # the config runs once, untimed
    assert _class_state() == before
    assert tuner.prune_configs({}) == CONFIGS


def test_patch_reaches_flas_cached_autotuner_and_mamba_ssm_kernels():
    """FLA 0.6.0 decorates some kernels with its CachedAutotuner, which overrides `run` (its
    config files) but not `prune_configs`; mamba-ssm uses Triton's Autotuner: the patch of
    the base class covers both."""
    from fla.ops.utils.cache import CachedAutotuner
    from fla.ops.utils.cumsum import chunk_local_cumsum_scalar_kernel
    from mamba_ssm.ops.triton.ssd_chunk_state import _chunk_state_fwd_kernel

    gdn.fla()
    assert "prune_configs" not in CachedAutotuner.__dict__ and "do_bench" not in CachedAutotuner.__dict__
    for kernel in (chunk_local_cumsum_scalar_kernel, _chunk_state_fwd_kernel):
        tuner = _autotuner(kernel)
        configs = tuner.prune_configs({})
        assert len(configs) > 1
        with tritonwarm.worker_share(5, 16):
            assert tuner.prune_configs({}) == [configs[5 % len(configs)]]
        assert tuner.prune_configs({}) == configs
    assert isinstance(_autotuner(chunk_local_cumsum_scalar_kernel), CachedAutotuner)


_INTERPRETED = textwrap.dedent("""
    import os, sys
    os.environ["TRITON_INTERPRET"] = "1"
    import torch, triton, triton.language as tl
    from triton.runtime.errors import OutOfResources
    from elman.harness import warm as tritonwarm

    configs = [triton.Config({"IDX": k}) for k in range(5)]

    @triton.autotune(configs=configs, key=["n"], cache_results=True)
    @triton.jit
    def count(x, n, IDX: tl.constexpr):
        tl.store(x + IDX, tl.load(x + IDX) + 1)

    i, n = int(sys.argv[1]), int(sys.argv[2])
    x = torch.zeros(5)
    with tritonwarm.worker_share(i, n):
        count[(1,)](x, 7)
    # each config of the share ran once (instead of being timed), the chosen one once more
    ran = [k for k in range(5) if x[k] > 0]
    print("RAN", ran, "BEST", count.best_config.kwargs["IDX"], "CACHE", count.cache_results)

    # a config that does not fit the GPU (the autotuner times it as inf): where it was the
    # worker's only one, the worker takes the kernel's full list for that call
    bad = tritonwarm.share(list(range(5)), i, n)[0]
    inner = count.fn.run
    def run(*args, **kwargs):
        if kwargs.get("IDX") == bad:
            raise OutOfResources(1, 0, "shared memory")
        return inner(*args, **kwargs)
    count.fn.run = run
    y = torch.zeros(5)
    with tritonwarm.worker_share(i, n):
        count[(1,)](y, 8)
    print("FALLBACK", count.best_config.kwargs["IDX"], int(y.sum()))
""")


@pytest.mark.parametrize("i,n", [(1, 3), (3, 2), (0, 16)])
def test_worker_runs_its_share_in_tritons_interpreter(i, n):
    proc = subprocess.run([sys.executable, "-c", _INTERPRETED, str(i), str(n)], capture_output=True,
                          text=True, timeout=300, cwd=ROOT, env={**os.environ, "TRITON_INTERPRET": "1"})
    lines = {l.split()[0]: l.split(maxsplit=1)[1] for l in proc.stdout.splitlines() if l.split()}
    assert proc.returncode == 0 and "RAN" in lines, proc.stdout[-2000:] + proc.stderr[-3000:]
    expected = tritonwarm.share(list(range(5)), i, n)
    assert lines["RAN"] == f"{expected} BEST {expected[0]} CACHE False"
    best, runs = map(int, lines["FALLBACK"].split())
    if len(expected) == 1:   # the full list: every other config ran once, the first of them twice
        assert (best, runs) == (min(set(range(5)) - {expected[0]}), 5)
    else:                    # the share's next config
        assert (best, runs) == (expected[1], 2)


# ---- the jobs ----------------------------------------------------------------------------------
def _calls(jobs):
    return {(j.call, j.level, j.dtype, j.T, j.B, j.D, j.expansion) for j in jobs}


def test_jobs_cover_both_libraries_and_every_call_of_the_later_stages():
    jobs = tritonwarm.jobs()
    assert {j.level for j in jobs} == {"mamba2", "fla-gdn"}
    assert len(_calls(jobs)) == len(jobs), "a call appears twice"
    calls = _calls(jobs)
    for level in ("mamba2", "fla-gdn"):
        e = registry.get(level)
        assert {("parity", level, dt, T, B, D, 2.0) for dt in e.dtypes for T, B, D in ((s.T, s.B, s.D) for s in e.test_shapes)} <= calls
        assert {("layer", level, "bfloat16", bench.T_DEFAULT, B, D, 1.0)
                for B in bench.SHAPES_B for D in bench.SHAPES_D} <= calls
        assert ("layer", level, "float32", *tritonwarm.CHAPTER_LAYER) in calls
        assert ("layer", level, "bfloat16", 512, 16, 1920, 1.0) in calls  # the E88 chapter's layers
    assert ("layer", "fla-gdn", "bfloat16", 512, 16, 1792, 2.0) in calls  # ... and its training-step baseline
    assert ("layer", "mamba2", "bfloat16", 512, 16, 1792, 2.0) not in calls
    assert _calls(tritonwarm.jobs(["e88"])) == {("layer", level, "bfloat16", 512, 16, 1920, 1.0) for level in
                                                ("mamba2", "fla-gdn")} | {("layer", "fla-gdn", "bfloat16", 512, 16, 1792, 2.0)}
    verify = [j for j in jobs if "verify" in j.groups]
    assert {(j.dtype, j.T, j.B, j.D, j.expansion) for j in verify} == \
        {(dt, *s) for dt in gdn.VERIFY_DTYPES for s in gdn.VERIFY_SHAPES}
    assert all(j.mode == "triton-unguarded" and j.level == "fla-gdn" for j in verify)
    assert [j.size for j in jobs] == sorted(j.size for j in jobs)


def test_jobs_of_chosen_groups_only():
    only = tritonwarm.jobs(["verify"])
    assert only and {g for j in only for g in j.groups} == {"verify"}
    bench_jobs = tritonwarm.jobs(["bench"], ["mamba2"])
    assert {j.level for j in bench_jobs} == {"mamba2"} and all(j.dtype == "bfloat16" for j in bench_jobs)
    with pytest.raises(ValueError, match="unknown group"):
        tritonwarm.jobs(["benchmarks"])
    # the parity stage's fla-gdn call at a verify shape runs once, in the mode that covers both
    both = tritonwarm.jobs(["parity", "verify"], ["fla-gdn"])
    shared = [j for j in both if set(j.groups) == {"parity", "verify"}]
    assert all(j.mode == "triton-unguarded" for j in shared)


def test_dry_run_lists_the_jobs(capsys):
    from elman import cli

    assert cli.main(["warm", "--dry-run", "-j", "4", "--groups", "bench"]) == 0
    out = capsys.readouterr().out
    assert f"{len(tritonwarm.jobs(['bench']))} jobs (bench) in 4 workers" in out
    assert out.count("layer  mamba2") == out.count("layer  fla-gdn") > 0


def test_workers_never_write_autotune_results():
    env = tritonwarm.worker_env()
    assert env["TRITON_CACHE_AUTOTUNING"] == "0" and env["FLA_CACHE_RESULTS"] == "0"
    code = ("import fla.utils, triton.knobs as k; "
            "print(fla.utils.FLA_CACHE_RESULTS, k.autotuning.cache)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert out.stdout.split()[-2:] == ["False", "False"], out.stderr[-2000:]


# ---- the parent --------------------------------------------------------------------------------
_FAKE_WORKER = textwrap.dedent("""
    import sys, time
    i, jobs = int(sys.argv[1]), int(sys.argv[2])
    for k in range(jobs):
        if i == 1 and k == 1:
            print("Traceback: the compiler of worker one broke", file=sys.stderr)
            sys.exit(3)
        print(f"FAIL {k} 0.5 RuntimeError: no config fits" if i == 2 and k == 0 else f"ok {k} 0.{k}", flush=True)
        print("a library's stray line", flush=True)
        time.sleep(0.05)
    sys.exit(1 if i == 2 else 0)
""")


def test_parent_reports_a_failing_worker_and_waits_for_the_others(tmp_path, monkeypatch, capsys):
    todo = tritonwarm.jobs(["verify"])
    monkeypatch.setattr(tritonwarm, "worker_command",
                        lambda i, n, args: [sys.executable, "-c", _FAKE_WORKER, str(i), str(len(todo))])
    failed = tritonwarm.run_workers(3, todo, argparse.Namespace(), tmp_path)
    out = capsys.readouterr().out
    assert failed == 2
    assert "worker 1 exited with 3" in out and "the compiler of worker one broke" in out
    for i in (0, 2):   # the others ran every job, one line each
        assert sum(line.startswith(f"[warm] worker  {i} ") for line in out.splitlines()) == len(todo)
    assert f"[warm] worker  0 {todo[0]}:    0.0 s" in out
    assert f"[warm] worker  2 {todo[0]}:    0.5 s  FAILED: RuntimeError: no config fits" in out
    assert "worker 2 exited with 1" in out and "stray" not in out


@pytest.mark.parametrize("stages,groups", [("warm baselines", "verify, parity, bench"), ("warm gdn", "verify")])
def test_gpu_pass_warms_for_the_stages_that_follow(tmp_path, stages, groups):
    """scripts/gpu_pass.sh's warm stage asks `elman warm` for the groups of the stages in the
    pass (here with --dry-run; the stages after it fail at once without a GPU)."""
    env = {**os.environ, "OUT": str(tmp_path), "ELMAN_RUN_DIR": str(tmp_path / "run"),
           "WARM_ARGS": "--dry-run", "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    proc = subprocess.run(["bash", str(ROOT / "scripts" / "gpu_pass.sh"), *stages.split()], env=env,
                          capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert f"jobs ({groups}) in" in proc.stdout, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert "stage warm ok" in proc.stdout


def test_out_of_memory_recognises_every_library_s_message():
    assert tritonwarm.out_of_memory(torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate"))
    assert tritonwarm.out_of_memory(RuntimeError("Triton Error [CUDA]: out of memory"))
    assert tritonwarm.out_of_memory(RuntimeError(
        "CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`"))
    assert not tritonwarm.out_of_memory(RuntimeError("CUDA error: an illegal memory access was encountered"))
    assert not tritonwarm.out_of_memory(ValueError("out of memory"))


def test_oom_from_triton_is_retried_and_other_errors_are_not(monkeypatch):
    calls = []

    def flaky(job):
        calls.append(job)
        if len(calls) < 3:
            raise RuntimeError("Triton Error [CUDA]: out of memory")

    monkeypatch.setattr(tritonwarm, "run_job", flaky)
    monkeypatch.setattr(tritonwarm.time, "sleep", lambda s: None)
    tritonwarm._run_with_retries("job")
    assert len(calls) == 3

    def broken(job):
        calls.append(job)
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    calls.clear()
    monkeypatch.setattr(tritonwarm, "run_job", broken)
    with pytest.raises(RuntimeError, match="illegal"):
        tritonwarm._run_with_retries("job")
    assert len(calls) == 1


def test_default_workers_fit_the_gpu_memory(monkeypatch):
    class Props:
        total_memory = 80 * 10**9  # an 80 GB H100: 74.5 GiB

    monkeypatch.setattr(tritonwarm.os, "sched_getaffinity", lambda pid: set(range(16)), raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: Props())
    assert tritonwarm.default_workers() == 74 // tritonwarm.WORKER_GIB
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert tritonwarm.default_workers() == min(16, tritonwarm.MAX_WORKERS)
