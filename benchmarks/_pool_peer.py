"""The peer of bench_sweep_pool.py: the same points run by a plain
concurrent.futures.ProcessPoolExecutor (the platform's default start method, the
parent having imported torch and tinit), each worker on one thread; the frames come
back to the parent, which gathers them and writes the merged CSVs. No point folders,
no records, no figure, no progress.

    python benchmarks/_pool_peer.py WORKERS layers=4,8 seeds=1 ... out=OUT_DIR"""

import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import torch

from tinit.experiments.configs import parse_layers
from tinit.experiments.measure.depth_sweep import depth_sweep_plan
from tinit.experiments.points import run_point
from tinit.model.config import InitConfig, ModelConfig, RunConfig


def one_thread() -> None:
    torch.set_num_threads(1)


def frames_of(point):
    return run_point(point).frames


def main() -> None:
    workers = int(sys.argv[1])
    kw = dict(a.split("=", 1) for a in sys.argv[2:])
    out = Path(kw["out"])
    model = ModelConfig(d_model=int(kw["d_model"]), n_heads=int(kw["heads"]), vocab_size=int(kw["vocab"]),
                        max_seq_len=int(kw["seq_len"]))  # fmt: skip
    run = RunConfig(batch=int(kw["batch"]), seq_len=int(kw["seq_len"]), device="cpu")
    depths = parse_layers(kw["layers"])
    plan = depth_sweep_plan(model, InitConfig(), run, depths, int(kw["seeds"]), ("naive", "scaled"),
                            ("pre", "post"), grads=kw.get("grads", "1") == "1")  # fmt: skip
    with ProcessPoolExecutor(workers, initializer=one_thread) as pool:
        frames = dict(zip((p.name for p in plan.points), pool.map(frames_of, plan.points), strict=True))
    out.mkdir(parents=True)
    for stem, df in plan.gather(frames).items():
        df.to_csv(out / f"{stem}.csv", index=False)


if __name__ == "__main__":
    main()
