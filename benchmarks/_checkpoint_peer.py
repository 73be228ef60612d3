"""What a user writes instead of ``tinit audit --checkpoint FOLDER``: load the model
whole with transformers, one forward with ``output_hidden_states``, the variance of the
stream at every block boundary written to a CSV (the peer of
``benchmarks/bench_checkpoint_scale.py``).

    python benchmarks/_checkpoint_peer.py FOLDER OUT.csv [--seq-len 128] [--batch 1] [--dtype float32]
"""

import argparse
import sys

import torch


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("folder")
    ap.add_argument("out")
    ap.add_argument("--seq-len", type=int, default=128)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--device", default="cpu")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    import pandas as pd
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(a.folder, dtype=getattr(torch, a.dtype)).eval().to(a.device)
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, model.config.vocab_size, (a.batch, a.seq_len), generator=gen).to(a.device)
    with torch.no_grad():
        hs = model(ids, output_hidden_states=True).hidden_states
    rows = [{"block": i, "stream_var": float(h.double().var(unbiased=False))} for i, h in enumerate(hs)]
    pd.DataFrame(rows).to_csv(a.out, index=False)


if __name__ == "__main__":
    sys.exit(main())
