"""The Vulkan device a llama.cpp binary should run on: the one our Vulkan backend runs on.

ggml's Vulkan backend hides CPU drivers (lavapipe) unless ``GGML_VK_VISIBLE_DEVICES`` lists them, and its
loader (the package ships its own) may order devices unlike ours. So every device of ours is made visible,
the binary lists what it sees (``--list-devices``: ``Vulkan0: NAME (M MiB, F MiB free)``), and ours is picked
by name: the k-th of that name where ours is the k-th of that name in our own order.
"""

from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass

from .llama_binary import LlamaBinary, LlamaBinaryUnavailable

DEVICE_LINE = re.compile(r"^\s*(Vulkan\d+)\s*:\s*(.*?)\s*\((\d+) MiB, (\d+) MiB free\)\s*$")


@dataclass(frozen=True)
class LlamaDevice:
    """A device as the binary names it (``Vulkan0``) and describes it, and the environment that shows it."""

    name: str
    description: str
    memory_mib: int
    env: dict[str, str]

    def label(self) -> str:
        return f"{self.name}: {self.description}"


def parse_device_list(text: str) -> list[tuple[str, str, int]]:
    """``(name, description, total MiB)`` of each Vulkan device in ``--list-devices`` output."""
    out = []
    for line in text.splitlines():
        m = DEVICE_LINE.match(line)
        if m:
            out.append((m.group(1), m.group(2), int(m.group(3))))
    return out


def list_llama_devices(binary: LlamaBinary, env: dict[str, str]) -> list[tuple[str, str, int]]:
    """The Vulkan devices ``binary`` sees with ``env``."""
    try:
        p = subprocess.run(
            [str(binary.path), "--list-devices"], env=env, capture_output=True, text=True, timeout=120
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        raise LlamaBinaryUnavailable(f"{binary.path} --list-devices failed: {e}") from None
    found = parse_device_list(p.stdout + "\n" + p.stderr)
    if p.returncode != 0 and not found:
        tail = (p.stdout + p.stderr).strip()[-2000:]
        raise LlamaBinaryUnavailable(f"{binary.path} --list-devices exited with {p.returncode}: {tail}")
    return found


def pick_device(listed: list[tuple[str, str, int]], ours: str, rank: int, env: dict[str, str]) -> LlamaDevice:
    """The ``rank``-th (from 0) listed device whose description is ``ours``."""
    same = [d for d in listed if d[1] == ours]
    if len(same) <= rank:
        seen = ", ".join(f"{n}: {d}" for n, d, _ in listed) or "none"
        raise LlamaBinaryUnavailable(
            f"llama.cpp sees no Vulkan device {ours!r} (#{rank + 1} of that name) to match ours; it sees: {seen}"
        )
    name, desc, mib = same[rank]
    return LlamaDevice(name, desc, mib, env)


def matching_device(binary: LlamaBinary, our_names: list[str], our_index: int) -> LlamaDevice:
    """The device of ``binary`` that is our device ``our_index`` (``our_names``: every device we enumerate)."""
    if not 0 <= our_index < len(our_names):
        raise ValueError(f"device index {our_index} is not among our {len(our_names)} Vulkan devices")
    env = dict(binary.env)
    env["GGML_VK_VISIBLE_DEVICES"] = ",".join(str(i) for i in range(len(our_names)))
    ours = our_names[our_index]
    rank = our_names[:our_index].count(ours)
    return pick_device(list_llama_devices(binary, env), ours, rank, env)
