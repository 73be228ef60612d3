"""The CUDA overlapped-streaming schedule, checked on the CPU with stand-in streams.

No GPU is needed: torch.cuda's Stream, Event, current_stream, stream() and
Tensor.record_stream are replaced by fakes that log what is called, and the
schedule of ``Transformer._iter_blocks_overlapped`` is checked against what
correctness on a real GPU requires:
  - each block is generated inside the side stream's context, after the side stream
    waited for the main stream (allocator reuse stays ordered);
  - main waits for that block's ready event before the block is handed out;
  - every parameter is marked as used on main (record_stream) before it is handed out;
  - block i+1 is generated before block i is used (that is the overlap);
  - at most two blocks are alive, and the numbers equal a fully built model.
The real-GPU version of the last point is tests/test_gpu.py.
"""

import gc
import weakref

import pytest
import torch

import tinit.model.transformer as transformer_module
from tinit.model.config import InitConfig, ModelConfig
from tinit.model.transformer import Transformer


class FakeEvent:
    count = 0

    def __init__(self, log):
        FakeEvent.count += 1
        self.id, self.log, self.recorded_on = FakeEvent.count, log, None

    def record(self, stream):
        self.recorded_on = stream
        self.log.append(("record", self.id, stream.name))


class FakeStream:
    def __init__(self, name, log):
        self.name, self.log = name, log

    def wait_stream(self, other):
        self.log.append(("wait_stream", self.name, other.name))

    def wait_event(self, event):
        self.log.append(("wait_event", self.name, event.id))


class Fakes:
    """The fake torch.cuda surface, plus which stream context is current."""

    def __init__(self):
        self.log = []
        self.main = FakeStream("main", self.log)
        self.current = self.main

    def install(self, monkeypatch):
        fakes = self

        class StreamContext:
            def __init__(self, stream):
                self.stream = stream

            def __enter__(self):
                self.saved, fakes.current = fakes.current, self.stream
                fakes.log.append(("enter", self.stream.name))

            def __exit__(self, *exc):
                fakes.current = self.saved
                fakes.log.append(("exit", self.stream.name))

        def record_stream(tensor, stream):
            fakes.log.append(("record_stream", id(tensor), stream.name))

        monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: self.main)
        monkeypatch.setattr(torch.cuda, "Stream", lambda device=None: FakeStream("side", self.log))
        monkeypatch.setattr(torch.cuda, "Event", lambda *a, **k: FakeEvent(self.log))
        monkeypatch.setattr(torch.cuda, "stream", StreamContext)
        monkeypatch.setattr(torch.Tensor, "record_stream", record_stream, raising=False)

        real_build = transformer_module.build_block

        def logged_build(cfg, init, layer, device, dtype):
            self.log.append(("build", layer, self.current.name))
            return real_build(cfg, init, layer, device, dtype)

        monkeypatch.setattr(transformer_module, "build_block", logged_build)


CFG = ModelConfig(n_layers=5, d_model=32, n_heads=2, vocab_size=64, max_seq_len=16)
INIT = InitConfig(recipe="scaled", seed=7)


def test_overlapped_schedule_orders_streams_events_and_record_stream(monkeypatch):
    fakes = Fakes()
    fakes.install(monkeypatch)
    model = Transformer(CFG, INIT, "cpu", stream=True, overlap=True)
    log = fakes.log
    for block in model._iter_blocks_overlapped():
        log.append(("use", block.layer, [id(p) for p in block.parameters()]))

    uses = {e[1]: i for i, e in enumerate(log) if e[0] == "use"}
    builds = {e[1]: i for i, e in enumerate(log) if e[0] == "build"}
    assert sorted(uses) == sorted(builds) == list(range(CFG.n_layers))
    for layer in range(CFG.n_layers):
        b = builds[layer]
        # generated on the side stream, after the side stream waited for main
        assert log[b][2] == "side"
        assert log[b - 2 : b] == [("wait_stream", "side", "main"), ("enter", "side")]
        # its ready event is recorded on the side stream, inside the context
        exit_at = next(i for i in range(b, len(log)) if log[i] == ("exit", "side"))
        records = [e for e in log[b:exit_at] if e[0] == "record"]
        assert len(records) == 1 and records[0][2] == "side"
        ready_id = records[0][1]
        # main waits for that event before the block is used
        assert log.index(("wait_event", "main", ready_id)) < uses[layer]
        # every parameter is marked as used on main before use
        use_entry = log[uses[layer]]
        for pid in use_entry[2]:
            marks = [i for i, e in enumerate(log) if e == ("record_stream", pid, "main")]
            assert marks and marks[0] < uses[layer]
        # overlap: the next block is generated before this one is used
        if layer + 1 < CFG.n_layers:
            assert builds[layer + 1] < uses[layer]


def test_overlapped_schedule_keeps_two_blocks_and_equals_built(monkeypatch):
    Fakes().install(monkeypatch)
    tokens = torch.randint(0, CFG.vocab_size, (2, 16), generator=torch.Generator().manual_seed(0))
    built = Transformer(CFG, INIT, "cpu", stream=False)
    streamed = Transformer(CFG, INIT, "cpu", stream=True, overlap=True)
    alive = []
    most_alive = 0
    x = streamed.embed_tokens(tokens)
    with torch.no_grad():
        for block in streamed._iter_blocks_overlapped():
            alive.append(weakref.ref(block))
            x = block(x, streamed.rope)
            del block
            gc.collect()
            most_alive = max(most_alive, sum(r() is not None for r in alive))
        out = streamed.logits(x)
        assert torch.equal(out, built(tokens))
    assert most_alive <= 2


@pytest.mark.parametrize("overlap", [True, False])
def test_cpu_never_takes_the_cuda_path(monkeypatch, overlap):
    called = []
    monkeypatch.setattr(Transformer, "_iter_blocks_overlapped", lambda self: called.append(1) or iter(()))
    model = Transformer(CFG, INIT, "cpu", stream=True, overlap=overlap)
    assert len(list(model.iter_blocks())) == CFG.n_layers
    assert not called
