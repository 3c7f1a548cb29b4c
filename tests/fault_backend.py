"""A backend that fails on purpose, for fault-injection tests of the scheduler and the server.

It is the numpy reference, except that a step holding ``poison_token`` raises :class:`InjectedFault` after
every layer has written its keys and values (as a device fault late in a step would leave the caches), and
that a KV cache of ``no_cache_len`` tokens cannot be made (``MemoryError``).
"""

from __future__ import annotations

from workbench.backends.base import Step
from workbench.backends.numpy_ref import NumpyBackend
from workbench.models.model import Model
from workbench.ops.graph import Graph, Op


class InjectedFault(RuntimeError):
    """The fault this backend raises."""


class _FailAtOp:
    """An op observer that raises after the op writing tensor ``name`` ran (and passes every call on to
    ``inner``)."""

    def __init__(self, name: str, message: str, inner=None):
        self.name, self.message, self.inner = name, message, inner

    def on_op(self, op: Op, step: Step, start_s: float, host_s: float, device_s: float | None = None) -> None:
        if self.inner is not None:
            self.inner.on_op(op, step, start_s, host_s, device_s)
        if self.name in op.outputs:
            raise InjectedFault(self.message)

    def on_step(self, *args) -> None:
        if self.inner is not None:
            self.inner.on_step(*args)


class FaultyBackend(NumpyBackend):
    """The numpy backend with injected faults (see the module docstring); ``faults`` counts them."""

    def __init__(self, model: Model, poison_token: int | None = None, no_cache_len: int | None = None):
        super().__init__(model)
        self.poison_token, self.no_cache_len = poison_token, no_cache_len
        self.faults = 0

    def new_cache(self, max_len: int, slack: int = 0):
        if max_len == self.no_cache_len:
            self.faults += 1
            raise MemoryError(f"injected: no memory for a KV cache of {max_len} tokens")
        return super().new_cache(max_len, slack)

    def run(self, graph: Graph, step: Step, observer=None):
        if self.poison_token is None or self.poison_token not in step.tokens.tolist():
            return super().run(graph, step, observer)
        self.faults += 1
        fail = _FailAtOp(graph.outputs[0], f"injected fault: token {self.poison_token} in the step", observer)
        return super().run(graph, step, fail)
