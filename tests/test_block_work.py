"""BlockWork (tinit.experiments.audit.reader): a checkpoint block's weights measured on a
thread of their own while the block's forward runs; the arena is written again only once
that block is measured, the ticks come on the calling thread in order, and an error of
the measuring thread is raised in the caller's (unless the caller is failing already)."""

import threading

import pytest
import torch

from tinit.experiments.audit.reader import BlockWork


def test_settle_waits_for_the_block_and_ticks_in_order_on_the_callers_thread():
    log, where = [], []
    gates = [threading.Event() for _ in range(3)]

    def measure(layer, tensors):
        gates[layer].wait()  # held until the caller has run that block's "forward"
        log.append(("measured", layer, float(tensors["w"].sum())))
        where.append(threading.current_thread() is threading.main_thread())

    def tick(layer):
        log.append(("tick", layer))
        where.append(threading.current_thread() is threading.main_thread())

    work = BlockWork(measure, tick)
    arena = torch.zeros(4)
    for layer in range(3):
        work.settle()  # before the arena is written again
        arena.fill_(layer + 1)
        work.submit(layer, {"w": arena})
        log.append(("forward", layer))  # the block's forward, while it is measured
        gates[layer].set()
    work.close()
    assert log == [
        ("forward", 0), ("measured", 0, 4.0), ("tick", 0),
        ("forward", 1), ("measured", 1, 8.0), ("tick", 1),
        ("forward", 2), ("measured", 2, 12.0), ("tick", 2),
    ]  # fmt: skip
    # measured on another thread (the overlap), ticked on the caller's (the progress bar)
    assert where == [False, True] * 3


def test_an_error_of_the_measuring_thread_is_raised_to_the_caller():
    def measure(layer, tensors):
        if layer == 1:
            raise ValueError("block 1 unreadable")

    work = BlockWork(measure)
    work.submit(0, {})
    work.submit(1, {})  # (settles block 0: fine)
    with pytest.raises(ValueError, match="block 1 unreadable"):
        work.close()


def test_a_failing_caller_keeps_its_own_error_and_the_thread_ends():
    threads = []

    def measure(layer, tensors):
        threads.append(threading.current_thread())
        raise ValueError("measuring failed too")

    work = BlockWork(measure)
    work.submit(0, {})
    work.close(failed=True)  # the caller's error stands: nothing raised here
    assert threads and not threads[0].is_alive()


def test_no_function_no_thread():
    work = BlockWork(None, lambda layer: pytest.fail("ticked without a measurement"))
    work.submit(0, {})
    work.close()
    assert work._pool is None
