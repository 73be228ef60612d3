"""The large-width prediction of every addition, from the init and the tokens alone.

The Gaussian (NNGP-style) recursion of each sequence's T x T token Gram matrix through
the embedding, norms, attention and FFN of tinit's stack, every std from the scheme's one
resolution and every multiplier from the block's (:mod:`tinit.mf.stack`, the walk;
:mod:`tinit.mf.kernels`, the deterministic steps; :mod:`tinit.mf.attention`, the softmax
averaged over Gaussian queries and keys by a seeded Monte Carlo). No model is built, no
I/O is done; float64 on the CPU, nothing of d but the fan-ins. ``tinit variance`` and
``tinit depth-sweep`` put it beside the measurement (the ``mf_*`` columns); docs/reference/
variance.md, "The large-width prediction", says what it takes as exact.
"""
