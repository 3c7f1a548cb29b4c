"""A notebook executed with papermill under a wall-clock limit: its kernel is killed when time is up.

Papermill's ``execution_timeout`` bounds one cell; a sweep point needs a bound on its whole run (kernel
start, every cell), whatever hangs. The kernel manager papermill creates is ours here (jupyter_client's,
remembering itself), so a watchdog thread can kill the kernel's process group (the kernel and whatever it
started) at the deadline: nbclient then finds the kernel dead, papermill fails, shuts the kernel manager
down, and :func:`execute_notebook` raises :class:`NotebookTimeout`.
"""

from __future__ import annotations

import os
import signal
import threading
from pathlib import Path
from typing import Any

DEFAULT_POINT_TIMEOUT_S = 3600.0  # a sweep point's whole run (its notebook's cells together)
KILL_RETRY_S = 0.5


class NotebookTimeout(RuntimeError):
    """The notebook ran past its time limit; its kernel was killed."""


def kill_kernel(km: Any) -> None:
    """SIGKILL the process group of ``km``'s kernel (a kernel starts its own session), else its process."""
    prov = getattr(km, "provisioner", None)
    pgid, pid = getattr(prov, "pgid", None), getattr(prov, "pid", None)
    try:
        if pgid and hasattr(os, "killpg"):
            os.killpg(pgid, signal.SIGKILL)
        elif pid:
            os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:  # already gone
        pass


def execute_notebook(
    notebook: str | Path,
    output: str | Path,
    parameters: dict[str, Any],
    cwd: str | Path,
    cell_timeout_s: float | None = None,
    limit_s: float | None = None,
) -> None:
    """Execute ``notebook`` into ``output`` with ``parameters`` (papermill, kernel ``python3``).

    Raises papermill's errors as they are, or :class:`NotebookTimeout` when ``limit_s`` seconds passed
    first (None: no limit; ``cell_timeout_s`` still bounds each cell).
    """
    import papermill
    from jupyter_client import AsyncKernelManager

    managers: list[AsyncKernelManager] = []

    class RememberedKernelManager(AsyncKernelManager):
        def __init__(self, **kwargs: Any):
            super().__init__(**kwargs)
            managers.append(self)

    finished, expired = threading.Event(), threading.Event()

    def watchdog() -> None:
        if finished.wait(limit_s):
            return
        expired.set()
        while not finished.is_set():  # a kernel still starting is killed once it exists
            for km in managers:
                kill_kernel(km)
            finished.wait(KILL_RETRY_S)

    if limit_s is not None:
        threading.Thread(target=watchdog, name="notebook-deadline", daemon=True).start()
    try:
        papermill.execute_notebook(
            str(notebook),
            str(output),
            parameters=parameters,
            progress_bar=False,
            cwd=str(cwd),
            execution_timeout=cell_timeout_s,
            kernel_name="python3",
            kernel_manager_class=RememberedKernelManager,
            # the kernel's own warnings (TCP without encryption: it listens on localhost only) are noise in
            # our output; its errors still show
            extra_arguments=["--IPKernelApp.log_level=ERROR"],
        )
    except Exception as e:
        if expired.is_set():
            raise NotebookTimeout(f"ran past its time limit of {limit_s:g} s; its kernel was killed") from e
        raise
    finally:
        finished.set()
