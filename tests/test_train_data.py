"""Guards the training data: the Markov language's entropy rate (its loss floor)
against a hand-computed chain and against sampled log-likelihoods, the seeded
batches, the held-out split of token files, and the standard-library corpus hash."""

import hashlib
import math

import numpy as np
import pytest

from tinit.experiments.training.data import MarkovChain, file_tokens, load_data, stdlib_corpus
from tinit.model.config import ConfigError


def _h(p):
    return -sum(x * math.log(x) for x in p if x > 0)


def test_two_state_chain_entropy_rate_by_hand():
    # P = [[1-a, a], [b, 1-b]]: pi = (b, a) / (a + b), H = pi_0 h(a) + pi_1 h(b)
    a, b = 0.3, 0.1
    chain = MarkovChain(np.array([[1, 0], [0, 1]]), np.array([[a, 1 - a], [b, 1 - b]]))
    pi0, pi1 = b / (a + b), a / (a + b)
    assert chain.stationary() == pytest.approx([pi0, pi1], abs=1e-12)
    assert chain.entropy_rate() == pytest.approx(pi0 * _h([a, 1 - a]) + pi1 * _h([b, 1 - b]), rel=1e-12)


def test_random_chain_is_sparse_stationary_and_its_entropy_matches_samples():
    chain = MarkovChain.random(vocab=32, k=4, seed=5)
    assert all(len(set(row)) == 4 for row in chain.succ.tolist())
    np.testing.assert_allclose(chain.prob.sum(1), 1.0, rtol=1e-12)
    P = chain.dense()
    pi = chain.stationary()
    np.testing.assert_allclose(pi @ P, pi, atol=1e-12)
    # the mean negative log-likelihood of sampled transitions estimates the entropy rate
    tokens = chain.sample(4000, 17, np.random.default_rng(0))
    nll = -np.log(P[tokens[:, :-1], tokens[:, 1:]]).ravel()
    se = nll.std() / math.sqrt(nll.size)
    assert abs(nll.mean() - chain.entropy_rate()) < 4 * se
    # windows start from pi: first-token frequencies match it (chi-square-sized tolerance)
    freq = np.bincount(tokens[:, 0], minlength=32) / 4000
    assert np.abs(freq - pi).max() < 4 * math.sqrt(pi.max() / 4000)


def test_large_vocab_stationary_by_sparse_iteration_matches_the_dense_solve(monkeypatch):
    import tinit.experiments.training.data as data

    exact = MarkovChain.random(vocab=300, k=3, seed=2).stationary()
    monkeypatch.setattr(data, "DENSE_MAX", 100)  # force the sparse path (a new chain: pi is cached)
    np.testing.assert_allclose(MarkovChain.random(vocab=300, k=3, seed=2).stationary(), exact,
                               rtol=1e-9, atol=1e-15)  # fmt: skip


def test_the_stationary_distribution_is_solved_once_per_chain(monkeypatch):
    """Every window starts from pi: solving it per batch (a dense V x V solve) cost a
    1024-token run 8x its step time. Once per chain, read-only, the same batches."""
    calls = []
    solve = MarkovChain._solve_stationary

    def counted(self):
        calls.append(1)
        return solve(self)

    reference = load_data("markov", vocab=64, seq_len=8, batch=4, seed=1, eval_batches=1)
    reference.reset(0)
    expected = [reference.next_batch() for _ in range(5)]
    monkeypatch.setattr(MarkovChain, "_solve_stationary", counted)
    data = load_data("markov", vocab=64, seq_len=8, batch=4, seed=1, eval_batches=1)
    data.reset(0)
    got = [data.next_batch() for _ in range(5)]
    assert len(calls) == 1  # the entropy rate, the eval set and 5 batches share it
    assert all((a == b).all() for a, b in zip(got, expected, strict=True))
    with pytest.raises(ValueError):
        data.chain.stationary()[0] = 1.0


def test_markov_batches_are_seeded_and_eval_is_fixed():
    a = load_data("markov", vocab=16, seq_len=8, batch=4, seed=1, eval_batches=2)
    b = load_data("markov", vocab=16, seq_len=8, batch=4, seed=1, eval_batches=2)
    assert a.floor == b.floor and a.eval_windows.shape == (8, 9)
    assert (a.eval_windows == b.eval_windows).all()
    a.reset(3)
    b.reset(3)
    assert (a.next_batch() == b.next_batch()).all()
    b.reset(4)
    a.reset(3)
    assert not (a.next_batch() == b.next_batch()).all()


@pytest.mark.parametrize("kind", ["bin", "npy", "txt"])
def test_token_files_are_memory_mapped_and_hold_out_their_end(tmp_path, kind):
    n = 2000
    values = np.arange(n) % 251
    path = tmp_path / f"tokens.{kind}"
    if kind == "bin":
        values.astype(np.uint16).tofile(path)
    elif kind == "npy":
        np.save(path, values.astype(np.int32))
    else:
        path.write_bytes(values.astype(np.uint8).tobytes())
    tokens, info = file_tokens(path)
    assert isinstance(tokens, np.memmap) or isinstance(tokens.base, np.memmap)
    assert info["sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()
    data = load_data(str(path), vocab=1, seq_len=10, batch=3, seed=0)
    assert data.vocab == (256 if kind == "txt" else 251)
    w = data.eval_windows.numpy()
    # held-out windows are consecutive tokens from the last 10% (positions >= 1800)
    assert ((w[:, 1:] - w[:, :-1]) % 251 == 1).all()
    train = data.train_tokens
    assert train.size == 1800
    data.reset(0)
    batch = data.next_batch().numpy()
    assert batch.shape == (3, 11) and ((batch[:, 1:] - batch[:, :-1]) % 251 == 1).all()


def test_bad_data_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError) as e:
        load_data(str(tmp_path / "missing.bin"), vocab=16, seq_len=8, batch=2, seed=0)
    assert e.value.field == "data"
    (tmp_path / "odd.bin").write_bytes(b"abc")
    with pytest.raises(ConfigError):
        file_tokens(tmp_path / "odd.bin")
    (tmp_path / "short.txt").write_bytes(b"abcdef")
    with pytest.raises(ConfigError):
        load_data(str(tmp_path / "short.txt"), vocab=16, seq_len=8, batch=2, seed=0)


def test_stdlib_corpus_sorted_capped_and_hashed(tmp_path):
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "z.py").write_bytes(b"zzzz")
    (tmp_path / "a.py").write_bytes(b"aaaa")
    (tmp_path / "site-packages").mkdir()
    (tmp_path / "site-packages" / "x.py").write_bytes(b"xxxx")
    (tmp_path / "c.txt").write_bytes(b"cccc")
    tokens, info = stdlib_corpus(cap=6, root=tmp_path)
    assert bytes(tokens) == b"aaaazz"  # a.py, then b/z.py cut at the cap; no site-packages, no .txt
    assert info["sha256"] == hashlib.sha256(b"aaaazz").hexdigest()
    assert info["bytes"] == 6 and info["files"] == 2
