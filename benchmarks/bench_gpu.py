"""GPU targets of issue 6, one script, one table.

On the device (an H200), with 2048 tokens (batch 4 x seq 512):
  1. `variance` on the 70B shape (80 layers, d 8192, 64 heads, d_ff 28672), naive,
     pre-norm, streamed: measurement time (no process start) in bf16 and in fp32
     with TF32 matmuls, and peak GPU memory.           targets: 0.6 s, 1.1 s, 6 GiB
  2. probe overhead: the same streamed forward with and without the probe.   <= 5%
  3. weight-generation overlap: streamed forward with the side stream on/off.
  4. `grad-norms` on an 80-layer width-4096 stack with the layer-wise backward:
     time and peak memory.
Times are medians of --repeats after a warm-up, taken with CUDA events.

    python benchmarks/bench_gpu.py                # on a GPU: the real sizes
    python benchmarks/bench_gpu.py --small        # anywhere: tiny sizes, checks the script
"""

import argparse
import dataclasses
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

from tinit.experiments.device import make_tokens, matmul_precision
from tinit.experiments.measure.probes import VarianceProbe
from tinit.experiments.measure.variance import run_variance
from tinit.model.config import InitConfig, ModelConfig, RunConfig
from tinit.model.transformer import Transformer

HERE = Path(__file__).resolve().parent
GIB = 2**30


class Timer:
    """Wall time of a callable: CUDA events on a GPU, perf_counter on the CPU."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"

    def __call__(self, fn: Callable[[], object]) -> float:
        if self.cuda:
            torch.cuda.synchronize()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            torch.cuda.synchronize()
            return start.elapsed_time(end) / 1e3
        t0 = time.perf_counter()
        fn()
        return time.perf_counter() - t0


def peak_reset(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats(device)


def peak_gib(device: torch.device) -> float:
    return torch.cuda.max_memory_allocated(device) / GIB if device.type == "cuda" else float("nan")


def median_time(timer: Timer, fn: Callable[[], object], repeats: int) -> float:
    fn()  # warm-up: CUDA context, cuBLAS handles, allocator pools
    return statistics.median(timer(fn) for _ in range(repeats))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--small", action="store_true", help="tiny sizes: check the script on any machine")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--skip-grad", action="store_true", help="skip the grad-norms case")
    ap.add_argument("--csv", type=Path, default=HERE / "out" / "bench_gpu.csv")
    args = ap.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    timer = Timer(device)
    if args.small:
        big = ModelConfig(n_layers=4, d_model=64, n_heads=4, d_ff=192, vocab_size=128, max_seq_len=32)
        grad_cfg = ModelConfig(n_layers=4, d_model=64, n_heads=4, vocab_size=128, max_seq_len=32)
        run = RunConfig(batch=2, seq_len=32, device=str(device), stream=True)
    else:
        big = ModelConfig(n_layers=80, d_model=8192, n_heads=64, d_ff=28672, vocab_size=1024, max_seq_len=512)
        grad_cfg = ModelConfig(n_layers=80, d_model=4096, n_heads=32, vocab_size=1024, max_seq_len=512)
        run = RunConfig(batch=4, seq_len=512, device=str(device), stream=True)
    init = InitConfig(scheme="naive")
    shape = "tiny" if args.small else "70B-shape"
    gshape = "tiny" if args.small else "80 x 4096"
    rows: list[tuple[str, float, float, str]] = []

    def record(name: str, seconds: float, gib: float, target: str = "") -> None:
        rows.append((name, seconds, gib, target))
        print(f"  {name:<52} {seconds:8.3f} s  {gib:7.2f} GiB  {target}", flush=True)

    def case(name: str, fn: Callable[[], object], repeats: int, target: str = "") -> float:
        """Median time and peak memory of ``fn``; a failure (OOM, CUDA error) is recorded
        as a row and the script goes on, so one bad case never costs the others."""
        try:
            peak_reset(device)
            secs = median_time(timer, fn, repeats)
        except (torch.OutOfMemoryError, RuntimeError) as exc:
            record(name, float("nan"), float("nan"), f"FAILED: {str(exc).splitlines()[0][:80]}")
            if device.type == "cuda":
                torch.cuda.empty_cache()
            return float("nan")
        record(name, secs, peak_gib(device), target)
        return secs

    # 1. the variance measurement, as `tinit variance --init naive --pre-norm --stream` runs it
    for dtype, tf32, target in (("bfloat16", False, "<= 0.6 s, <= 6 GiB"), ("float32", True, "<= 1.1 s")):
        r = dataclasses.replace(run, dtype=dtype, tf32=tf32)
        case(
            f"variance {shape} {dtype}{' +TF32' if tf32 else ''} (measurement)",
            lambda r=r: run_variance(big, init, r, inits=("naive",), norm_positions=("pre",)),
            args.repeats,
            target,
        )

    # 2./3. the streamed forward alone: probe on/off, overlap on/off (bf16)
    tokens = make_tokens(big, run, init.seed, device)
    results = {}
    for overlap in (True, False):
        model = Transformer(big, init, device, torch.bfloat16, stream=True, overlap=overlap)
        for with_probe in (False, True):

            def forward(model=model, with_probe=with_probe):
                probe = VarianceProbe(torch.float32) if with_probe else None
                with torch.no_grad():
                    model.forward_stream(tokens, probe)
                if probe is not None:
                    probe.frame()  # the one host transfer

            on_off = ("on " if overlap else "off", "on" if with_probe else "off")
            name = "streamed forward bf16, overlap {}, probe {}".format(*on_off)
            results[(overlap, with_probe)] = case(name, forward, args.repeats)
    record("probe overhead (overlap on)", results[(True, True)] / results[(True, False)] - 1, float("nan"),
           "<= 5%")  # fmt: skip
    record(
        "overlap speed-up (probe on): off/on", results[(False, True)] / results[(True, True)], float("nan")
    )

    # 4. grad-norms with the layer-wise backward
    if not args.skip_grad:
        from tinit.experiments.measure.grad_norms import run_grad_norms

        r = dataclasses.replace(run, dtype="float32", tf32=True)
        case(
            f"grad-norms {gshape} fp32+TF32, layer-wise backward",
            lambda: run_grad_norms(grad_cfg, init, r, inits=("naive",), norm_positions=("pre",)),
            max(1, args.repeats - 1),
        )

    name = torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu"
    print()
    print(f"device: {name}; torch {torch.__version__}; python {sys.version.split()[0]}; small={args.small}")
    print(f"{'case':<56}{'value':>10}{'peak GiB':>10}  target")
    for label, value, gib, target in rows:
        print(f"{label:<56}{value:>10.3f}{gib:>10.2f}  {target}")
    args.csv.parent.mkdir(parents=True, exist_ok=True)
    with open(args.csv, "w") as f:
        f.write("case,value,peak_gib,target\n")
        for label, value, gib, target in rows:
            f.write(f'"{label}",{value:.5f},{gib:.3f},"{target}"\n')
    print(f"wrote {args.csv}")


if __name__ == "__main__":
    with matmul_precision(RunConfig()):  # start from TF32 off; cases opt in
        main()
