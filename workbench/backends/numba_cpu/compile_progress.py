"""A progress bar while numba compiles the cpu kernels (the first run on a host: minutes on 2 cores; a run
that finds them in numba's cache shows nothing).

numba announces each compilation through its event API (``numba:compile``); the bar names the kernel being
built and how many are done, and a ticker redraws it every second so that the elapsed time moves during one
long compilation (the decode program alone takes about a minute: docs/backend-cpu.md).
"""

from __future__ import annotations

import sys
import threading
from types import TracebackType

from ...numba_jit import numba
from ...paths import cache_dir

event = numba.core.event


class CompileProgress(event.Listener):
    """Context manager: while open, numba compilations draw a tqdm bar on stderr (once the first starts)."""

    def __init__(self, what: str = "cpu kernels", stream=None):
        self.what, self.stream = what, stream if stream is not None else sys.stderr
        self.bar = None
        self.active: list[str] = []
        self.done = 0
        self._stop = threading.Event()
        self._lock = threading.Lock()

    # numba's listener interface
    def on_start(self, ev: event.Event) -> None:
        name = _kernel_name(ev)
        with self._lock:
            if self.bar is None:
                self._open()
            self.active.append(name)
            self._show()

    def on_end(self, ev: event.Event) -> None:
        with self._lock:
            if self.active:
                self.active.pop()
            self.done += 1
            if self.bar is not None:
                self.bar.update(1)
                self._show()

    def _open(self) -> None:
        from tqdm import tqdm

        print(
            f"cpu backend: compiling the {self.what} for this host (first run only; cached in "
            f"{numba.config.CACHE_DIR or cache_dir('numba')})",
            file=self.stream,
            flush=True,
        )
        self.bar = tqdm(
            desc="compiling", unit=" kernels", file=self.stream, dynamic_ncols=True, mininterval=0.5
        )
        threading.Thread(target=self._tick, name="compile-progress", daemon=True).start()

    def _show(self) -> None:
        if self.bar is not None and self.active:
            self.bar.set_postfix_str(
                self.active[0] + (f" > {self.active[-1]}" if len(self.active) > 1 else "")
            )

    def _tick(self) -> None:
        while not self._stop.wait(1.0):
            with self._lock:
                if self.bar is not None:
                    self.bar.refresh()

    def __enter__(self) -> CompileProgress:
        event.register("numba:compile", self)
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        event.unregister("numba:compile", self)
        self._stop.set()
        with self._lock:
            if self.bar is not None:
                self.bar.close()
                print(f"cpu backend: {self.done} kernels compiled", file=self.stream, flush=True)


def _kernel_name(ev: event.Event) -> str:
    disp = (ev.data or {}).get("dispatcher")
    fn = getattr(disp, "py_func", None)
    return getattr(fn, "__qualname__", None) or str(disp)
