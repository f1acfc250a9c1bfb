"""`elman train`: the training protocol (VARIANTS.md sections 0, 5, 6). Chapter:
book/chapters/training_protocol.ipynb.

Recipe: LadderLM around any registered level; i.i.d. byte windows (`elman.data`);
fp32 master weights and optimizer state with the forward under bf16 autocast on CUDA;
schedule-free AdamW (lr 3e-4, `warmup_steps` 1000 given to the optimizer, betas
0.9/0.95, weight decay 0.01 except on norms, biases and decay parameters; its update fused,
`optim.AdamWScheduleFree`); gradient
clipping at 1.0; a budget of `--steps` optimizer steps or `--minutes` of wall clock
counted from the end of the first optimizer step (so data setup, compilation and
autotuning are not counted), without the pauses for validation and checkpoints.

Every step checks the loss and the gradient norm: a NaN or inf stops the run, with a message,
and leaves the last good checkpoint as it was; that step's optimizer update, queued before the
check, is skipped on the device (`step.TrainStep`).
Checkpoints (model, optimizer, step, data position, RNG, elapsed time, the loss history)
are written atomically on an interval, at the end and on SIGINT/SIGTERM, outside `runs/`
(default `checkpoints/`). `--resume DIR` continues bit for bit: the data windows of step
k depend only on (seed, rank, k), and validation and checkpoints restore the exact
training weights after looking at schedule-free's averaged ones.

Evaluation (`evaluate`) runs on the weights the optimizer says to evaluate
(schedule-free's averaged weights, `averaged_weights`), over windows that tile the
held-out split without overlap: every `--val-every` steps on `--val-windows` evenly
spaced tiles (0: all; the same tiles for every model), and at the end on all of them.
Each evaluation logs the loss per source of the predicted bytes. The headline metric is
the validation loss in nats/byte and bits/byte (nats / ln 2) with its standard error
se = s_w / sqrt(n) over the n window means (s_w their standard deviation); a
standard error below `SE_TARGET` = 0.005 nats/byte needs n >= (s_w / 0.005)^2 windows,
which each evaluation logs as `windows_needed`. Windows of one document are correlated,
so this se is a lower bound when documents span many windows.

Outputs: a JSONL log `runs/<run>/train/<name>/log.jsonl` (a line every `--log-every`
steps, validation lines, and at the end the per-step losses of the last 100 steps), and
one `train` record in `runs/<run>/records.jsonl`. "Last-100" is the mean training loss
over the last 100 optimizer steps, "last-1000" over the last 1000; tokens/s is the median
over logged intervals after the first 100 steps (warm-up), counting B*T predicted bytes
per step over all ranks, with validation and checkpoint time left out. The record also
says how much of the training split the run read (`data_passes`, flagged past one pass)
and which kernel path every layer ran (`paths.PathProbe`, probed on the first step).

Several GPUs: `torchrun --nproc_per_node N -m elman train ...` trains one model with
DDP; each rank draws its own windows, rank 0 logs, checkpoints and records.
"""
from __future__ import annotations

import argparse
import ast
import contextlib
import datetime as dt
import json
import math
import os
import signal
import statistics
import sys
import threading
import time
from collections import deque
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from tqdm import tqdm

from ..core import records, spectral
from .data import DEFAULT_DATA, Batches, ByteData, DataError
from .lm import NORMS, LadderLM, n_params
from .optim import AdamWScheduleFree
from .paths import PathProbe, summary as path_summary
from .step import TrainStep

FORMAT = "elman-train-1"
WARMUP_EXCLUDED_STEPS = 100  # tokens/s median ignores intervals ending before this step
SE_TARGET = 0.005  # nats/byte: the validation standard error the split is sized for
EXIT_NONFINITE, EXIT_SIGINT, EXIT_SIGTERM = 3, 130, 143

DEFAULTS: dict[str, Any] = {
    "level": "E1", "dim": 256, "depth": 4, "expansion": 1.0, "option": [], "backend": None,
    "norm": "auto", "grad_checkpoint": False, "graph": False, "power_iterations": 1,
    "data": str(DEFAULT_DATA),
    "batch": 32, "seq": 512,
    "lr": 3e-4, "warmup": 1000, "betas": [0.9, 0.95], "weight_decay": 0.01, "grad_clip": 1.0,
    "seed": 42, "steps": None, "minutes": None, "precision": None, "device": None,
    "log_every": 10, "val_every": 500, "val_windows": 2048, "save_every": 1000,
    "name": None, "runs_dir": None, "checkpoint_dir": None, "resume": None,
}
# What --resume lets you change; everything else comes from the checkpoint.
RESUMABLE = ("steps", "minutes", "log_every", "val_every", "save_every", "runs_dir",
             "checkpoint_dir", "device", "resume", "data", "graph")


class TrainError(RuntimeError):
    """A run cannot start or continue; the message says why and what to do."""


def add_arguments(p: argparse.ArgumentParser) -> None:
    d = DEFAULTS
    a = p.add_argument
    a("--level", help=f"registered level name, e.g. E1, E0, mamba2 (default {d['level']})")
    a("--dim", type=int, help=f"model width d (default {d['dim']})")
    a("--depth", type=int, help=f"layers (default {d['depth']})")
    a("--expansion", type=float, help="layer expansion e (default 1.0)")
    a("--option", action="append", metavar="KEY=VALUE",
      help="a level-specific layer option, repeatable (e.g. --option r_h_mode=none)")
    a("--backend", choices=("cuda", "reference"), help="layer backend (default: cuda on GPU)")
    a("--norm", choices=NORMS, help="add+RMSNorm implementation (default auto)")
    a("--grad-checkpoint", action="store_true", default=None, help="gradient checkpointing per layer")
    a("--graph", action="store_true", default=None,
      help="replay forward, backward and clipping from a CUDA graph (one GPU; the optimizer "
           "runs outside it; elman.training.step)")
    a("--power-iterations", type=int,
      help="spectral norm: power iterations per training step on the CUDA backend, the vector "
           "kept across steps (default 1; the reference backend and evaluation run the "
           "specification's 3 per forward; elman.core.spectral)")
    a("--data", help=f"raw byte file, .txt or packed .xz (default {DEFAULT_DATA.relative_to(records.ROOT)})")
    a("--batch", type=int, help=f"windows per step per rank (default {d['batch']})")
    a("--seq", type=int, help=f"T, bytes predicted per window (default {d['seq']})")
    a("--lr", type=float, help=f"learning rate (default {d['lr']})")
    a("--warmup", type=int, help=f"schedule-free warmup steps (default {d['warmup']})")
    a("--betas", type=float, nargs=2, help="AdamW betas (default 0.9 0.95)")
    a("--weight-decay", type=float, help=f"(default {d['weight_decay']}; never on norms, biases, decays)")
    a("--grad-clip", type=float, help=f"max gradient norm (default {d['grad_clip']})")
    a("--seed", type=int, help=f"model init and data windows (default {d['seed']})")
    a("--steps", type=int, help="stop after this many optimizer steps (in total)")
    a("--minutes", type=float, help="stop after this much training wall clock (in total)")
    a("--precision", choices=("bf16", "fp32"), help="autocast dtype (default bf16 on CUDA, fp32 on CPU)")
    a("--device", help="cpu, cuda, cuda:1 (default cuda if available)")
    a("--log-every", type=int, help=f"steps per log line (default {d['log_every']})")
    a("--val-every", type=int, help=f"steps between validations (default {d['val_every']})")
    a("--val-windows", type=int, help=f"evenly spaced held-out tiles per interval evaluation, "
                                       f"0 for all; the final one uses all (default {d['val_windows']})")
    a("--save-every", type=int, help=f"steps between checkpoints (default {d['save_every']})")
    a("--name", help="run name (default <level>_d<dim>x<depth>)")
    a("--runs-dir", help="records folder (default: $ELMAN_RUN_DIR or a new runs/<stamp>_<commit>_<gpu>)")
    a("--checkpoint-dir", help="checkpoint folder (default checkpoints/<run>/<name>)")
    a("--resume", help="continue from a checkpoint file or its folder; `auto`: this run's own "
                       "checkpoint if it has one (same --runs-dir/$ELMAN_RUN_DIR and --name), else start")


def parse_options(items: list[str]) -> dict[str, Any]:
    """['k=v', ...] -> {k: v} with Python literals parsed (numbers, True/False, strings)."""
    out = {}
    for item in items or []:
        if "=" not in item:
            raise TrainError(f"--option takes KEY=VALUE, got {item!r}")
        key, value = item.split("=", 1)
        lowered = {"true": True, "false": False}
        if value.lower() in lowered:
            out[key] = lowered[value.lower()]
            continue
        try:
            out[key] = ast.literal_eval(value)
        except (ValueError, SyntaxError):
            out[key] = value
    return out


def config(args: argparse.Namespace) -> dict[str, Any]:
    """The run's configuration: defaults, or the checkpoint's with --resume, then the flags."""
    given = {k: v for k, v in vars(args).items() if k in DEFAULTS and v is not None}
    if given.get("resume") == "auto":
        given["resume"] = _auto_resume(given)
        if given["resume"] is None:
            del given["resume"]
    if given.get("resume"):
        ckpt = load_checkpoint(given["resume"])
        cfg = dict(ckpt["args"])
        clash = {k: v for k, v in given.items() if k not in RESUMABLE and v != cfg.get(k)}
        if clash:
            raise TrainError(f"--resume takes the configuration from the checkpoint; these flags "
                             f"differ from it: {clash}. Only {', '.join(RESUMABLE)} may change.")
        cfg.update(given)
        return cfg
    cfg = {**DEFAULTS, **given}
    if cfg["steps"] is None and cfg["minutes"] is None:
        raise TrainError("give a budget: --steps N or --minutes M (the protocol is --minutes 10)")
    for key in ("dim", "depth", "batch", "seq", "log_every", "val_every", "save_every",
                "power_iterations"):
        if cfg[key] < 1:
            raise TrainError(f"--{key.replace('_', '-')} must be positive, got {cfg[key]}")
    if cfg["val_windows"] < 0:
        raise TrainError(f"--val-windows must be 0 (all) or positive, got {cfg['val_windows']}")
    cfg["name"] = cfg["name"] or f"{cfg['level']}_d{cfg['dim']}x{cfg['depth']}"
    return cfg


def _checkpoint_path(cfg: dict, run_dir: Path) -> Path:
    path = checkpoint_file(cfg.get("checkpoint_dir") or
                           records.ROOT / "checkpoints" / run_dir.name / cfg["name"])
    return path if path.suffix == ".pt" else path / "checkpoint.pt"


def _auto_resume(given: dict) -> str | None:
    """`--resume auto`: this run's checkpoint if one exists (same run folder and name)."""
    level, dim, depth = (given.get(k, DEFAULTS[k]) for k in ("level", "dim", "depth"))
    name = given.get("name") or f"{level}_d{dim}x{depth}"
    run_dir = Path(given["runs_dir"]) if given.get("runs_dir") else records.run_dir(create=False)
    path = _checkpoint_path({**given, "name": name}, run_dir)
    return str(path) if path.exists() else None


# ---------------------------------------------------------------------------------------
# Model, optimizer, checkpoints

NO_DECAY_WORDS = ("norm", "bias", "a_log", "dt_bias", "decay")


def no_weight_decay(name: str, p: torch.nn.Parameter) -> bool:
    """Norm weights, biases and decay parameters: by the `_no_weight_decay` attribute or by
    name (a part containing norm, bias, a_log, dt_bias or decay, or a last part `b`/`b_*`)."""
    if getattr(p, "_no_weight_decay", False):
        return True
    parts = name.lower().split(".")
    last = parts[-1]
    return (last == "b" or last.startswith("b_")
            or any(w in part for part in parts for w in NO_DECAY_WORDS))


def param_groups(model: torch.nn.Module, weight_decay: float) -> list[dict]:
    decay, keep = [], []
    for name, p in model.named_parameters():
        (keep if no_weight_decay(name, p) else decay).append(p)
    return [{"params": decay, "weight_decay": weight_decay},
            {"params": keep, "weight_decay": 0.0}]


def build(cfg: dict, device: torch.device) -> tuple[LadderLM, AdamWScheduleFree]:
    torch.manual_seed(cfg["seed"])
    backend = cfg["backend"] or ("cuda" if device.type == "cuda" else "reference")
    model = LadderLM(cfg["level"], cfg["dim"], cfg["depth"], cfg["expansion"], backend=backend,
                     norm=cfg["norm"], gradient_checkpointing=cfg["grad_checkpoint"],
                     **parse_options(cfg["option"])).to(device)
    if backend == "cuda":  # a configuration without the key: the specification's count
        spectral.per_step(model, cfg.get("power_iterations", spectral.SPEC_ITERATIONS))
    opt = AdamWScheduleFree(param_groups(model, cfg["weight_decay"]), lr=cfg["lr"],
                            betas=tuple(cfg["betas"]), warmup_steps=cfg["warmup"])
    opt.train()
    return model, opt


@contextlib.contextmanager
def averaged_weights(model: torch.nn.Module, opt: AdamWScheduleFree):
    """Schedule-free's averaged weights in the model for evaluation; afterwards the exact
    training weights come back (eval()/train() alone would round them)."""
    saved = [p.detach().clone() for p in model.parameters()]
    opt.eval()
    model.eval()
    try:
        yield
    finally:
        opt.train()
        model.train()
        with torch.no_grad():
            for p, s in zip(model.parameters(), saved):
                p.copy_(s)


def _cpu(state: dict) -> dict:
    return {k: v.detach().cpu().clone() for k, v in state.items()}


def save_checkpoint(path: Path, state: dict) -> None:
    """Atomic: write a temporary file, fsync, rename over the old one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        torch.save(state, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def checkpoint_file(path: str | Path) -> Path:
    path = Path(path)
    return path / "checkpoint.pt" if path.is_dir() else path


def load_checkpoint(path: str | Path) -> dict:
    """A checkpoint written by `elman train`; clear errors for missing or corrupt files."""
    f = checkpoint_file(path)
    if not f.exists():
        raise TrainError(f"no checkpoint at {f}")
    try:
        state = torch.load(f, map_location="cpu", weights_only=True)
    except Exception as exc:  # torch raises several types for truncated or foreign files
        raise TrainError(f"checkpoint {f} is corrupt or truncated and cannot be read "
                         f"({type(exc).__name__}: {exc}). Resume from an older copy or start over.") from exc
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        raise TrainError(f"{f} is not an `elman train` checkpoint (format {FORMAT})")
    return state


# ---------------------------------------------------------------------------------------
# Distributed setup


def _setup(cfg: dict) -> tuple[torch.device, int, int]:
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    want = cfg["device"] or ("cuda" if torch.cuda.is_available() else "cpu")
    if want.startswith("cuda") and not torch.cuda.is_available():
        raise TrainError(f"--device {want} asked for, but CUDA is not available here")
    device = torch.device(want)
    if world > 1:
        if device.type == "cuda":
            device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
            torch.cuda.set_device(device)
        if not dist.is_initialized():
            dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    elif device.type == "cuda" and device.index is not None:
        torch.cuda.set_device(device)
    return device, rank, world


class _Signals:
    """Remember the first SIGINT/SIGTERM instead of dying, so the loop can checkpoint first."""

    def __init__(self):
        self.received: int | None = None
        self.old = {}

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            for s in (signal.SIGINT, signal.SIGTERM):
                self.old[s] = signal.signal(s, self._handle)
        return self

    def _handle(self, signum, frame):
        if self.received is not None:  # a second signal: stop now, the default way
            self.__exit__()
            signal.raise_signal(signum)
            return
        self.received = signum

    def __exit__(self, *exc):
        for s, h in self.old.items():
            signal.signal(s, h)
        self.old = {}


# ---------------------------------------------------------------------------------------
# The loop


def evaluate(model: torch.nn.Module, data: ByteData, positions: np.ndarray, T: int, batch: int,
             device: torch.device, amp) -> dict:
    """Next-byte loss over the validation windows at `positions` (each predicts T bytes):
    mean in nats/byte and bits/byte with the standard error over window means, the window
    count the SE target needs, and the mean per source of the predicted bytes."""
    names, src = data.target_sources(positions, T)
    sums, counts = np.zeros(len(names)), np.zeros(len(names))
    means = []
    with torch.no_grad(), amp():
        for i in range(0, len(positions), batch):
            x = torch.from_numpy(data.windows(positions[i:i + batch], T)).to(device).long()
            logits = model(x[:, :-1])
            loss = F.cross_entropy(logits.float().flatten(0, 1), x[:, 1:].flatten(),
                                   reduction="none").view(x.shape[0], T).double().cpu().numpy()
            means.append(loss.mean(axis=1))
            idx = src[i:i + batch]
            for k in range(len(names)):
                sums[k] += loss[idx == k].sum()
                counts[k] += (idx == k).sum()
    w = np.concatenate(means)
    sd = float(w.std(ddof=1)) if len(w) > 1 else float("nan")
    loss, se = float(w.mean()), sd / math.sqrt(len(w))
    return {"val_loss": loss, "val_se": se, "val_bits": loss / math.log(2),
            "val_bits_se": se / math.log(2), "windows": len(w), "window_sd": sd,
            "windows_needed": math.ceil((sd / SE_TARGET) ** 2) if math.isfinite(sd) else None,
            "per_source": {n: float(sums[k] / counts[k]) for k, n in enumerate(names) if counts[k]}}


def _median_rate(rates: list[list[float]]) -> float | None:
    warm = [r for s, r in rates if s > WARMUP_EXCLUDED_STEPS] or [r for _, r in rates[1:]] \
        or [r for _, r in rates]
    return statistics.median(warm) if warm else None


def _mean(xs) -> float | None:
    xs = list(xs)
    return sum(xs) / len(xs) if xs else None


class _Log:
    def __init__(self, path: Path | None):
        self.path = path
        if path:
            path.parent.mkdir(parents=True, exist_ok=True)

    def __call__(self, kind: str, **fields) -> None:
        if self.path:
            with open(self.path, "a") as f:
                f.write(json.dumps({"kind": kind, **fields}) + "\n")


def run(cfg: dict) -> dict:
    """Train per cfg (see `config`); returns the end-of-run summary. Raises TrainError.
    SIGINT/SIGTERM from here on (setup included) end the run with a checkpoint."""
    with _Signals() as signals:
        return _run(cfg, signals)


def _run(cfg: dict, signals: _Signals) -> dict:
    device, rank, world = _setup(cfg)
    lead = rank == 0
    try:
        data = ByteData(cfg["data"])
    except DataError as exc:
        raise TrainError(str(exc)) from exc
    precision = cfg["precision"] or ("bf16" if device.type == "cuda" else "fp32")
    cfg["precision"] = precision

    def amp():
        return torch.autocast(device.type, dtype=torch.bfloat16, enabled=precision == "bf16")

    model, opt = build(cfg, device)
    ckpt = load_checkpoint(cfg["resume"]) if cfg["resume"] else None
    if ckpt:
        try:
            model.load_state_dict(ckpt["model_train"])
        except RuntimeError as exc:
            raise TrainError(f"checkpoint {cfg['resume']} does not fit this model: {exc}") from exc
        opt.load_state_dict(ckpt["optimizer"])
        torch.set_rng_state(ckpt["rng"]["torch"])
        if device.type == "cuda" and ckpt["rng"].get("cuda") is not None:
            torch.cuda.set_rng_state(ckpt["rng"]["cuda"], device)
        cfg["runs_dir"] = cfg["runs_dir"] or ckpt["run_dir"]
    run_dir = Path(cfg["runs_dir"]) if cfg["runs_dir"] else records.run_dir(create=lead)
    cfg["runs_dir"] = str(run_dir)
    ckpt_path = _checkpoint_path(cfg, run_dir)
    log_path = run_dir / "train" / cfg["name"] / "log.jsonl"
    if lead and not ckpt and log_path.exists():
        raise TrainError(f"{log_path} exists: choose another --name or --resume the run")
    log = _Log(log_path if lead else None)

    step = ckpt["step"] if ckpt else 0
    elapsed_before = ckpt["elapsed_s"] if ckpt else 0.0
    losses: deque = deque(ckpt["losses"] if ckpt else [], maxlen=1000)
    rates: list = list(ckpt["rates"]) if ckpt else []
    vals: list = list(ckpt["vals"]) if ckpt else []
    count = n_params(model)
    ddp = model
    if cfg.get("graph") and (world > 1 or device.type != "cuda"):
        raise TrainError("--graph captures the step in a CUDA graph: it needs one CUDA device "
                         f"(world size {world}, device {device})")
    if world > 1:
        ids = [device.index] if device.type == "cuda" else None
        ddp = torch.nn.parallel.DistributedDataParallel(model, device_ids=ids)
    val_interval = data.val_positions(cfg["seq"], cfg["val_windows"] or None)
    val_all = data.val_positions(cfg["seq"])
    train_bytes = data.val_start
    tokens_per_step = cfg["batch"] * cfg["seq"] * world
    budget_s = cfg["minutes"] * 60 if cfg["minutes"] is not None else math.inf
    budget_steps = cfg["steps"] if cfg["steps"] is not None else math.inf
    env = records.env()
    log("start", step=step, time=_now(), args=cfg, n_params=count, world_size=world,
        env=env, data={"path": str(data.path), "bytes": len(data), "val_start": data.val_start,
                       "sha256": (data.manifest or {}).get("sha256")},
        resumed_from=str(checkpoint_file(cfg["resume"])) if ckpt else None)
    if lead:
        print(f"Model: level {cfg['level']}, {count:,} parameters, d{cfg['dim']} x {cfg['depth']}, "
              f"backend {model.backend}, norm {model.norm}, {precision}, world size {world}")

    def state_dict() -> dict:
        state = {"format": FORMAT, "args": cfg, "step": step, "elapsed_s": elapsed,
                 "model_train": _cpu(model.state_dict()), "optimizer": opt.state_dict(),
                 "losses": list(losses), "rates": rates, "vals": vals,
                 "rng": {"torch": torch.get_rng_state(),
                         "cuda": torch.cuda.get_rng_state(device) if device.type == "cuda" else None},
                 "run_dir": str(run_dir), "log": str(log_path), "n_params": count}
        with averaged_weights(model, opt):
            state["model"] = _cpu(model.state_dict())
        return state

    def checkpoint() -> None:
        if lead:
            save_checkpoint(ckpt_path, state_dict())
            log("checkpoint", step=step, path=str(ckpt_path))
        if world > 1:
            dist.barrier()

    def validate(positions: np.ndarray) -> dict:
        with averaged_weights(model, opt):
            v = evaluate(model, data, positions, cfg["seq"], cfg["batch"], device, amp)
        vals.append([step, v["val_loss"]])
        log("val", step=step, **v)
        return v

    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    batches = Batches(data, cfg["batch"], cfg["seq"], cfg["seed"], rank, step, device)
    train_step = TrainStep(model, opt, cfg["grad_clip"], torch.bfloat16 if precision == "bf16" else None,
                           graph=bool(cfg.get("graph")), forward=ddp)
    probe = PathProbe(model)
    kernel_paths = None
    bar = tqdm(total=None if budget_steps == math.inf else budget_steps, initial=step, disable=not lead,
               unit="step", dynamic_ncols=True, mininterval=1 if sys.stderr.isatty() else 30)
    t0, paused = None, 0.0
    elapsed = elapsed_before
    window: list[tuple[float, float]] = []
    t_log = time.perf_counter()
    stop = None
    try:
        if step >= budget_steps or elapsed >= budget_s:
            stop = "budget"
        for k, batch in (batches if stop is None else ()):
            loss, gnorm = train_step(batch)
            # The optimizer step and the next batch's copy are queued first: the update changes
            # nothing unless the loss and the norm are finite (a device-side guard), so the GPU
            # has both to run during the step's one host read, which decides whether the run goes on.
            train_step.update()
            batches.prefetch()
            sig, late = signals.received is not None, lead and elapsed >= budget_s
            if world > 1:
                flags = torch.stack([loss.float(), gnorm.float(), loss.new_tensor(float(sig)),
                                     loss.new_tensor(float(late))])
                dist.all_reduce(flags)
                loss_v, gnorm_v, sig, late = flags.tolist()
            else:
                loss_v, gnorm_v = torch.stack([loss.float(), gnorm.float()]).tolist()
            loss_v /= world
            if not (math.isfinite(loss_v) and math.isfinite(gnorm_v)):
                last = f"{ckpt_path} (step {_ckpt_step(ckpt_path)})" if ckpt_path.exists() else "none written yet"
                msg = (f"non-finite {'loss' if not math.isfinite(loss_v) else 'gradient norm'} at step "
                       f"{step + 1} (loss {loss_v}, grad norm {gnorm_v}): stopped; the step's optimizer "
                       f"update was skipped. Last good checkpoint: {last}.")
                log("stop", step=step, reason="nonfinite", loss=loss_v, grad_norm=gnorm_v, message=msg)
                raise NonFinite(msg)
            if kernel_paths is None:
                kernel_paths = probe.result()
                probe.close()
                log("kernels", step=k + 1, kernels=path_summary(kernel_paths), **kernel_paths)
                if lead:
                    bar.write(f"kernel paths: {path_summary(kernel_paths)}; backward "
                              f"{kernel_paths['backward'] or '-'}")
            step = k + 1
            losses.append(loss_v)
            window.append((loss_v, gnorm_v))
            now = time.perf_counter()
            if t0 is None:
                t0, t_log, window = now, now, []
            elapsed = elapsed_before + (now - t0 - paused)
            if step % cfg["log_every"] == 0 and window:
                rate = tokens_per_step * len(window) / max(now - t_log, 1e-9)
                mem = torch.cuda.max_memory_allocated(device) / 2**20 if device.type == "cuda" else None
                lr = opt.param_groups[0]["scheduled_lr"]
                mean_loss = _mean(x for x, _ in window)
                rates.append([step, rate])
                log("train", step=step, loss=mean_loss, tokens_per_s=rate, lr=lr,
                    grad_norm=_mean(g for _, g in window), memory_mb=mem, elapsed_s=elapsed)
                if lead:
                    bar.set_postfix(loss=f"{mean_loss:.4f}", tok_s=f"{rate:.0f}", refresh=False)
                    bar.write(f"step {step:6d} | loss {mean_loss:.4f} | lr {lr:.2e} | grad "
                              f"{_mean(g for _, g in window):.2f} | tok/s {rate:.0f} | "
                              f"elapsed {elapsed / 60:.2f} min")
                window, t_log = [], time.perf_counter()
            bar.update(1)
            t_pause = time.perf_counter()
            if step % cfg["val_every"] == 0:
                validate(val_interval)
            if step % cfg["save_every"] == 0:
                checkpoint()
            pause = time.perf_counter() - t_pause  # neither the budget nor tokens/s count it
            t_log += pause
            paused += pause
            if sig:
                stop = "signal"
                break
            if step >= budget_steps or late or (world == 1 and elapsed >= budget_s):
                stop = "budget"
                break
    finally:
        probe.close()
        bar.close()
    if stop == "signal":
        checkpoint()
        signum = signals.received or signal.SIGTERM
        log("stop", step=step, reason=signal.Signals(signum).name, checkpoint=str(ckpt_path))
        if lead:
            print(f"elman train: {signal.Signals(signum).name} at step {step}: checkpoint "
                  f"{ckpt_path}; continue with `elman train --resume {ckpt_path.parent}`")
        raise Interrupted(signum)
    final = validate(val_all)
    checkpoint()
    peak = torch.cuda.max_memory_allocated(device) / 2**20 if device.type == "cuda" else None
    passes = step * cfg["batch"] * (cfg["seq"] + 1) * world / train_bytes
    summary = {
        "steps": step, "tokens": step * tokens_per_step, "elapsed_s": elapsed,
        "val_loss": final["val_loss"], "val_se": final["val_se"], "val_bits": final["val_bits"],
        "val_bits_se": final["val_bits_se"], "val_windows": final["windows"],
        "val_windows_needed": final["windows_needed"], "val_per_source": final["per_source"],
        "last100": _mean(list(losses)[-100:]), "last1000": _mean(losses),
        "tokens_per_s": _median_rate(rates),
        "tokens_per_s_mean": step * tokens_per_step / elapsed if elapsed > 0 else None,
        "data_passes": passes, "past_one_pass": passes > 1, "kernel_paths": kernel_paths,
        "kernels": path_summary(kernel_paths or {}),
        "peak_memory_mb": peak,
        "final_loss": losses[-1] if losses else None,
        "log": str(log_path.relative_to(run_dir)), "checkpoint": str(ckpt_path),
        "n_params": count, "world_size": world, "gpu": env["gpu"],
    }
    log("end", step=step, time=_now(), losses=list(losses)[-100:], **summary)
    if lead:
        params = {k: cfg[k] for k in ("name", "level", "dim", "depth", "expansion", "option",
                                      "batch", "seq", "lr", "warmup", "betas", "weight_decay",
                                      "grad_clip", "seed", "steps", "minutes", "precision", "data")}
        params.update(n_params=count, backend=model.backend, norm=model.norm, family=model.entry.family,
                      data_sha256=(data.manifest or {}).get("sha256"), world_size=world)
        records.write(records.make("train", cfg["level"], f"{model.backend}+{model.norm}",
                                   params, summary), run_dir)
        print(f"VAL: {final['val_bits']:.4f} +- {final['val_bits_se']:.4f} bits/byte "
              f"({final['val_loss']:.4f} +- {final['val_se']:.4f} nats/byte, {final['windows']} windows)  "
              f"last-100 {summary['last100']:.4f}  last-1000 {summary['last1000']:.4f}  "
              f"tokens/s {_fmt_rate(summary['tokens_per_s'])}  steps {step}  "
              f"data passes {passes:.2f}{' (past one pass)' if passes > 1 else ''}  "
              f"kernels: {summary['kernels']}")
    return summary


class NonFinite(TrainError):
    pass


class Interrupted(Exception):
    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


def _ckpt_step(path: Path) -> int | None:
    try:
        return load_checkpoint(path)["step"]
    except TrainError:
        return None


def _fmt_rate(rate: float | None) -> str:
    return "-" if rate is None else f"{rate:.0f}"


def _now() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")


def main(args: argparse.Namespace) -> int:
    try:
        run(config(args))
    except NonFinite as exc:
        print(f"elman train: {exc}", file=sys.stderr)
        return EXIT_NONFINITE
    except TrainError as exc:
        print(f"elman train: {exc}", file=sys.stderr)
        return 1
    except Interrupted as exc:
        return EXIT_SIGINT if exc.signum == signal.SIGINT else EXIT_SIGTERM
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    return 0
