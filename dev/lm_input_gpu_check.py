"""What the input costs a training step of E1 d1280 x 6 (B 64, T 512, the trainer-graph step:
forward, backward and clipping replayed from a CUDA graph, the optimizer, one host read).

1. The bytes' distribution. The profile (`training.profile`) draws uniform random bytes;
   `elman train` reads text, where a few bytes (space, e, t, newline) are most of the tokens.
   Only the embedding's backward reads the tokens' values in a way that could cost more (a
   sort and a reduction per vocabulary row). Printed: tokens/s on both, the kernels whose
   time differs most, and the embedding backward alone on both index sets.
2. How the batches arrive: already on the GPU; copied from pinned memory on the loop's
   thread (`data.Batches`, which the trainer prefetches once the step is queued); or made by
   a background thread that hands them over through a queue. Such a thread holds the GIL
   while it gathers a batch, which delays the loop that launches the next step.

Run on a GPU: python dev/lm_input_gpu_check.py [TEXT_FILE]  (default: this repository's .py
and .md files, concatenated).
"""
from __future__ import annotations

import queue
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "lib"))
from elman.training import memory  # noqa: E402
from elman.training.data import Batches, ByteData  # noqa: E402
from elman.training.step import TrainStep  # noqa: E402

B, T, STEPS = 64, 512, 100


def text_bytes(path: str | None) -> np.ndarray:
    if path:
        return np.fromfile(path, dtype=np.uint8)
    root = Path(__file__).resolve().parents[1]
    files = sorted(p for p in root.rglob("*") if p.suffix in (".py", ".md") and ".venv" not in p.parts)
    return np.frombuffer(b"\x1e".join(p.read_bytes() for p in files), dtype=np.uint8)


def windows(text: np.ndarray, batches: int, seed: int = 0) -> list[torch.Tensor]:
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(batches):
        pos = rng.integers(0, len(text) - T - 1, size=B)
        out.append(torch.from_numpy(text[pos[:, None] + np.arange(T + 1)]).cuda().long())
    return out


def rate(step: TrainStep, batches, prefetch=lambda: None) -> float:
    """Tokens/s of STEPS trainer-graph steps (after 5 warm-up steps) over an endless iterator
    of device batches, by the host clock (the trainer's)."""
    def one():
        loss, gnorm = step(next(batches))
        step.update()
        prefetch()
        torch.stack([loss.float(), gnorm.float()]).tolist()
    for _ in range(5):
        one()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(STEPS):
        one()
    torch.cuda.synchronize()
    return B * T * STEPS / (time.perf_counter() - t)


def cycle(batches: list[torch.Tensor]):
    i = 0
    while True:
        yield batches[i % len(batches)]
        i += 1


def thread_loader(data: ByteData):
    """Batches gathered and pinned by a background thread, two ahead, through a queue."""
    q: queue.Queue = queue.Queue(maxsize=2)

    def fill():
        k = 0
        while True:
            q.put(torch.from_numpy(data.batch(k, B, T, 42)).pin_memory())
            k += 1
    threading.Thread(target=fill, daemon=True).start()
    while True:
        yield q.get().to("cuda", non_blocking=True).long()


def kernels(step: TrainStep, batch: torch.Tensor) -> Counter:
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        loss, _ = step(batch)
        step.update()
        torch.cuda.synchronize()
    c = Counter()
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            c[e.name[:90]] += e.device_time_total / 1e3
    return c


def embedding_backward(indices: torch.Tensor, dim: int = 1280) -> float:
    grad = torch.randn(indices.numel(), dim, device="cuda")
    f = lambda: torch.ops.aten.embedding_dense_backward(grad, indices.reshape(-1), 256, -1, False)
    for _ in range(3):
        f()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(20):
        f()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / 20


def main() -> None:
    text = text_bytes(sys.argv[1] if len(sys.argv) > 1 else None)
    counts = np.bincount(text, minlength=256)
    print(f"text: {len(text) / 1e6:.1f} MB; the 4 commonest bytes are "
          f"{100 * np.sort(counts)[-4:].sum() / len(text):.1f} % of it")
    model, opt, rand, cfg = memory.setup("E1", 1280, 6, 1.0, B, T)
    step = TrainStep(model, opt, cfg["grad_clip"], graph=True)
    g = torch.Generator(device="cuda").manual_seed(1)
    randoms = [rand] + [torch.randint(0, 256, (B, T + 1), device="cuda", generator=g) for _ in range(7)]
    texts = windows(text, 8)
    for name, batches in (("random", randoms), ("text", texts), ("random", randoms), ("text", texts)):
        print(f"{name:7s} {rate(step, cycle(batches)) / 1e3:8.1f}K tok/s (trainer-graph, {STEPS} steps)")
    kr, kt = kernels(step, randoms[0]), kernels(step, texts[0])
    print(f"kernel total: random {sum(kr.values()):.3f} ms, text {sum(kt.values()):.3f} ms")
    diff = sorted(set(kr) | set(kt), key=lambda k: -abs(kt[k] - kr[k]))
    for k in diff[:12]:
        print(f"  {kr[k]:8.3f} {kt[k]:8.3f} ms  {k}")
    for name, idx in (("random", randoms[0][:, :-1]), ("text", texts[0][:, :-1])):
        print(f"embedding_dense_backward {name}: {embedding_backward(idx.contiguous()):.3f} ms")

    path = Path(sys.argv[1]) if len(sys.argv) > 1 else Path("/tmp/lm_input_text.bin")
    if len(sys.argv) == 1:
        text.tofile(path)
    data = ByteData(path)
    loader = Batches(data, B, T, 42, device="cuda")
    for name, batches, prefetch in (
            ("on the GPU already", cycle(texts), lambda: None),
            ("Batches, prefetched after the update", (x for _, x in loader), loader.prefetch),
            ("a loader thread", thread_loader(data), lambda: None)):
        print(f"{name:38s} {rate(step, batches, prefetch) / 1e3:8.1f}K tok/s")


if __name__ == "__main__":
    main()
