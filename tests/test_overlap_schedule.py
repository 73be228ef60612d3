"""The CUDA overlapped-streaming schedule, checked on the CPU against CUDA's ordering
contract rather than against a list of calls.

No GPU is needed. torch.cuda's Stream, Event, current_stream, stream() and
Tensor.record_stream are replaced by a small model of what they guarantee: work queued
on one stream runs in order; an event marks a point of a stream's queue; `wait_event`
and `wait_stream` order a stream's later work after such a point (vector clocks, so the
ordering is transitive); memory freed by a tensor allocated on a stream may be handed
out again to that stream's next allocation at once, unless `record_stream` told the
allocator another stream still uses it. Whatever order the schedule makes its calls
in, it must give what a caller relies on:
  - ready: every block handed out was generated before main's first use of it;
  - safe reuse: a block generated on the side stream never writes into memory that
    main may still be reading (a block freed, neither recorded on main nor waited for);
  - overlap: block i+1 is generated, off the main stream, before block i is used;
  - at most two blocks alive, and the numbers of a fully built model.
The checker is itself checked: schedules that drop each guarantee are caught. The
real-GPU version of the numbers is tests/test_gpu.py.
"""

import weakref

import pytest
import torch

import tinit.model.build as build_module
from tinit.model.config import InitConfig, ModelConfig
from tinit.model.transformer import Transformer

CFG = ModelConfig(n_layers=5, d_model=32, n_heads=2, vocab_size=64, max_seq_len=16)
INIT = InitConfig(scheme="scaled", seed=7)


class CudaModel:
    """Streams as vector clocks: ``clock[s][t]`` is how much of stream t's queue the
    next work on stream s is ordered after (``clock[s][s]``: what s has queued)."""

    def __init__(self):
        self.clock: dict[str, dict[str, int]] = {"main": {"main": 0}}
        self.current = "main"
        self.violations: list[str] = []
        self.built: list[tuple[int, str]] = []  # (layer, stream) in the order generated
        self.freed: list[dict] = []  # freed blocks whose memory a later allocation may get
        self.recorded: set[int] = set()  # ids of tensors marked as used on main

    # --- the stream primitives --------------------------------------------------------
    def new_stream(self, name: str) -> str:
        self.clock[name] = {name: 0}
        return name

    def enqueue(self, stream: str) -> tuple[str, int]:
        self.clock[stream][stream] += 1
        return stream, self.clock[stream][stream]

    def snapshot(self, stream: str) -> dict[str, int]:
        return dict(self.clock[stream])

    def merge(self, stream: str, snap: dict[str, int]) -> None:
        own = self.clock[stream]
        for t, n in snap.items():
            if t != stream:
                own[t] = max(own.get(t, 0), n)

    def ordered_after(self, stream: str, point: tuple[str, int]) -> bool:
        t, n = point
        return self.clock[stream].get(t, 0) >= n

    # --- what the schedule does with them ---------------------------------------------
    def generate(self, layer: int) -> tuple[str, int]:
        """A block's weights are allocated and written on the current stream."""
        stream = self.current
        for block in self.freed:
            if block["stream"] != stream or block["recorded"]:
                continue  # another pool, or the allocator waits for main itself
            if stream != "main" and not self.ordered_after(stream, block["last_use"]):
                old = block["layer"]
                self.violations.append(f"layer {layer} may overwrite layer {old} while main reads it")
        self.built.append((layer, stream))
        return self.enqueue(stream)

    def use(self, block, birth: tuple[str, int]) -> tuple[str, int]:
        """Main runs the block: its weights must have been written before."""
        if not self.ordered_after("main", birth):
            self.violations.append(f"layer {block.layer} used before it was generated")
        return self.enqueue("main")


def install(monkeypatch) -> CudaModel:
    model = CudaModel()
    births: dict[int, tuple[str, int]] = {}

    class Event:
        def __init__(self, *args, **kwargs):
            self.snap: dict[str, int] = {}

        def record(self, stream=None):
            name = stream.name if stream is not None else model.current
            self.snap = model.snapshot(name)

    class Stream:
        count = 0

        def __init__(self, device=None, name=None):
            if name is None:
                Stream.count += 1
                name = model.new_stream(f"side{Stream.count}")
            self.name = name

        def wait_event(self, event):
            model.merge(self.name, event.snap)

        def wait_stream(self, other):
            model.merge(self.name, model.snapshot(other.name))

    main = Stream(name="main")

    class StreamContext:
        def __init__(self, stream):
            self.stream = stream

        def __enter__(self):
            self.saved, model.current = model.current, self.stream.name

        def __exit__(self, *exc):
            model.current = self.saved

    def record_stream(tensor, stream):
        if stream.name == "main":
            model.recorded.add(id(tensor))

    real_build = build_module.build_block

    def build_block(cfg, init, layer, device, dtype):
        block = real_build(cfg, init, layer, device, dtype)
        births[id(block)] = model.generate(layer)
        return block

    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: main)
    monkeypatch.setattr(torch.cuda, "Stream", Stream)
    monkeypatch.setattr(torch.cuda, "Event", Event)
    monkeypatch.setattr(torch.cuda, "stream", StreamContext)
    monkeypatch.setattr(torch.Tensor, "record_stream", record_stream, raising=False)
    monkeypatch.setattr(build_module, "build_block", build_block)
    model.births = births
    return model


def consume(model: CudaModel, blocks) -> None:
    """What a forward pass does with the streamed blocks: run each on main, drop it."""
    for i, block in enumerate(blocks):
        # overlap: the next block is already generated, off the main stream
        if i + 1 < CFG.n_layers:
            ahead = [s for layer, s in model.built if layer == i + 1]
            if not ahead or ahead[0] == "main":
                model.violations.append(f"layer {i + 1} not generated on a side stream before layer {i} runs")
        last_use = model.use(block, model.births[id(block)])
        recorded = all(id(p) in model.recorded for p in block.parameters())
        stream = next(s for layer, s in model.built if layer == block.layer)
        freed = {"layer": block.layer, "stream": stream, "last_use": last_use, "recorded": recorded}
        weakref.finalize(block, model.freed.append, freed)
        del block  # freed by reference counting, at once (no gc.collect: 0.2-0.5 s a call here)
    # every block was freed as it went out of use: a block kept alive (a reference cycle)
    # would hide the reuse the checker looks for
    assert len(model.freed) == CFG.n_layers, f"{len(model.freed)} of {CFG.n_layers} blocks freed"


def test_overlapped_blocks_are_ready_reuse_safe_and_prefetched(monkeypatch):
    model = install(monkeypatch)
    net = Transformer(CFG, INIT, "cpu", stream=True, overlap=True)
    consume(model, build_module.overlapped_blocks(CFG, INIT, net._device, torch.float32))
    assert [layer for layer, _ in model.built] == list(range(CFG.n_layers))
    assert model.violations == []


def _side_schedule(net, wait=True, protect=True, prefetch=True):
    """A hand-written overlapped schedule that can leave out each guarantee."""
    main, side = torch.cuda.current_stream(), torch.cuda.Stream()

    def build(layer):
        if protect:
            side.wait_stream(main)
        with torch.cuda.stream(side):
            block = build_module.build_block(net.cfg, net.init, layer, "cpu", torch.float32)
            ready = torch.cuda.Event()
            ready.record(side)
        return block, ready

    pending = build(0) if prefetch else None
    for layer in range(net.cfg.n_layers):
        block, ready = pending if prefetch else build(layer)
        if wait:
            main.wait_event(ready)
        if prefetch and layer + 1 < net.cfg.n_layers:
            pending = build(layer + 1)
        yield block
        del block


@pytest.mark.parametrize(
    ("drop", "words"),
    [("wait", "used before it was generated"), ("protect", "may overwrite"), ("prefetch", "not generated")],
)
def test_the_checker_catches_a_schedule_without_each_guarantee(monkeypatch, drop, words):
    model = install(monkeypatch)
    net = Transformer(CFG, INIT, "cpu", stream=True, overlap=True)
    consume(model, _side_schedule(net, **{drop: False}))
    assert any(words in v for v in model.violations), model.violations
    # and the same schedule with every guarantee passes
    model = install(monkeypatch)
    consume(model, _side_schedule(net))
    assert model.violations == []


def test_overlapped_schedule_keeps_two_blocks_and_equals_built(monkeypatch):
    install(monkeypatch)
    tokens = torch.randint(0, CFG.vocab_size, (2, 16), generator=torch.Generator().manual_seed(0))
    built = Transformer(CFG, INIT, "cpu", stream=False)
    streamed = Transformer(CFG, INIT, "cpu", stream=True, overlap=True)
    alive = []
    most_alive = 0
    x = streamed.embed_tokens(tokens)
    with torch.no_grad():
        blocks = build_module.overlapped_blocks(CFG, INIT, streamed._device, torch.float32)
        for block in blocks:
            alive.append(weakref.ref(block))
            x = block(x, streamed.rope)
            del block  # freed by reference counting (no gc.collect: slow in a big process)
            most_alive = max(most_alive, sum(r() is not None for r in alive))
        out = streamed.logits(x)
        assert torch.equal(out, built(tokens))
    assert most_alive <= 2


def test_a_cpu_model_runs_without_touching_cuda(monkeypatch):
    """On the CPU, overlap asked for or not, a streamed model needs no CUDA stream and
    gives the fully built model's numbers."""

    def no_cuda(*args, **kwargs):
        raise AssertionError("a CPU model called torch.cuda")

    for name in ("current_stream", "Stream", "Event", "stream"):
        monkeypatch.setattr(torch.cuda, name, no_cuda)
    tokens = torch.randint(0, CFG.vocab_size, (2, 16), generator=torch.Generator().manual_seed(1))
    built = Transformer(CFG, INIT, "cpu", stream=False)
    with torch.no_grad():
        for overlap in (True, False):
            streamed = Transformer(CFG, INIT, "cpu", stream=True, overlap=overlap)
            assert torch.equal(streamed(tokens), built(tokens))
