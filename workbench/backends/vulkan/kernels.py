"""The kernels: each shader's push constants (mirrored from its GLSL block), its tunables (specialization
constants) with their defaults and device-limit checks, and the pipelines built from them.

Tunables are ``<kernel>.<name>=<int>`` (``--tune matvec.wg=256,matvec.row_threads=64``); every combination is
checked against the device (invocations, subgroup size, shared memory) before any pipeline is created.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any

from .device import DeviceFeatures, VulkanDevice
from .gemma3n import OPS as GEMMA3N_OPS
from .shaders import compile_shader

FORMATS = ("F32", "F16", "BF16", "Q8_0", "Q5_0", "Q4_K", "Q6_K")
# decoder defines of every weight format (GGUF blocks, then the re-quantized planar int8 / int4 formats)
FORMAT_DEFINES: tuple[tuple[str, ...], ...] = (
    *((f"FMT_{f}",) for f in FORMATS),
    ("FMT_I8",),
    *(("FMT_I4", f"I4_GROUP={g}", *a) for g in (32, 64, 128) for a in ((), ("I4_ASYM",))),
)
PUSH_BYTES = 128
KV_SEQS = 8  # caches bound at binding 4 (= KV_SEQS in shaders/common.glsl): sequences one dispatch can serve


@dataclass(frozen=True)
class KernelSpec:
    """A shader: its push-constant fields (``name`` or ``name:f`` float or ``name:4`` uvec4) and tunables."""

    shader: str
    push: tuple[str, ...]
    tunables: tuple[tuple[str, int], ...]  # (name, constant_id) in spec-constant order; values from Tuning

    def pack(self, values: dict[str, Any]) -> bytes:
        out = bytearray()
        for field in self.push:
            name, _, kind = field.partition(":")
            v = values[name]
            if kind == "f":
                out += struct.pack("<f", float(v))
            elif kind == "4":
                out += struct.pack("<4I", *[int(x) for x in v])
            else:
                out += struct.pack("<I", int(v))
        if len(out) > PUSH_BYTES:
            raise ValueError(f"{self.shader}: push constants of {len(out)} bytes exceed {PUSH_BYTES}")
        return bytes(out)


KERNELS: dict[str, KernelSpec] = {
    "matvec": KernelSpec(
        "matvec",
        (
            "pl:4",
            "pl2:4",
            "K",
            "N",
            "T",
            "row0",
            "x_off",
            "x_stride",
            "y_off",
            "y_stride",
            "nw_off",
            "eps:f",
            "r_off",
            "r_stride",
            "o_off",
            "o_stride",
            "pw_off",
            "peps:f",
            "cnt_off",
            "ms_off",
            "ms_out_off",
            "q_out_off",
            "qnw_off",
            "qeps:f",
        ),
        (("wg", 0), ("row_threads", 1)),
    ),
    "matmul": KernelSpec(
        "matmul",
        ("pl:4", "K", "N", "T", "row0", "x_off", "x_stride", "y_off", "y_stride"),
        (("wg", 0), ("wg_m", 1), ("tm", 2), ("tn", 3)),
    ),
    "matmul_coop": KernelSpec(
        "matmul_coop",
        ("pl:4", "K", "N", "T", "row0", "x_off", "x_stride", "y_off", "y_stride"),
        (("wg", 0), ("wm", 1), ("tm", 2), ("tn", 3), ("bk", 5), ("ahead", 6)),
    ),
    "attention": KernelSpec(
        "attention",
        (
            "q_off",
            "q_stride",
            "o_off",
            "o_stride",
            "n_heads",
            "n_kv",
            "hd",
            "kv_dim",
            "ring",
            "window",
            "v_off",
            "part_off",
            "n_split",
            "split_keys",
            "scale:f",
            "cnt_off",
            "t0",
            "q8_off",
            "q8_stride",
        ),
        (("wg", 0), ("tile", 4)),
    ),
    "attn_combine": KernelSpec(
        "attn_combine",
        (
            "o_off",
            "o_stride",
            "part_off",
            "n_heads",
            "hd",
            "n_split",
            "window",
            "split_keys",
            "t0",
            "q_off",
            "q_stride",
        ),
        (("wg", 0),),
    ),
    "rmsnorm": KernelSpec(
        "rmsnorm",
        (
            "x_off",
            "x_stride",
            "y_off",
            "y_stride",
            "r_off",
            "r_stride",
            "width",
            "w_off",
            "freq_off",
            "eps:f",
            "v_src",
            "v_stride",
            "kv_dim",
            "ring",
            "window",
            "v_off",
        ),
        (("wg", 0),),
    ),
    "eltwise": KernelSpec(
        "eltwise",
        ("a_off", "a_stride", "b_off", "b_stride", "y_off", "y_stride", "width", "rows", "cap:f"),
        (("wg", 0),),
    ),
    "embed": KernelSpec("embed", ("pl:4", "K", "N", "row0", "y_off", "y_stride", "scale:f"), (("wg", 0),)),
    "kv_store": KernelSpec(
        "kv_store",
        ("k_off", "k_stride", "v_off_act", "v_stride", "kv_dim", "ring", "window", "v_off", "t0"),
        (("wg", 0),),
    ),
    # Gemma 3n's kinds (gemma3n.py): one define per kind
    "gemma3n": KernelSpec(
        "gemma3n",
        (
            *(f"{t}_{s}" for t in "abcdyz" for s in ("off", "stride")),
            "width",
            "n",
            "w_off",
            "w2_off",
            "w3_off",
            "w4_off",
            "eps:f",
            "scale:f",
        ),
        (("wg", 0),),
    ),
    "argmax": KernelSpec("argmax", ("x_off", "n", "block", "part_off", "n_parts"), (("wg", 0),)),
    "stream_read": KernelSpec("stream_read", ("n4", "out_off"), (("wg", 0),)),
    "quant_act": KernelSpec(
        "quant_act",
        ("x_off", "x_stride", "q_off", "q_stride", "K", "nw_off", "eps:f", "ms_off"),
        (("wg", 0),),
    ),
}
# weight formats with an integer (int8-activation) matvec: shaders/quant_q8.glsl
Q8_FORMATS = ("Q8_0", "Q5_0", "Q4_K", "Q6_K", "I8", "I4")

# tunables that are not specialization constants but change how the program is built
PROGRAM_TUNABLES = {
    # flash decoding: the fewest keys of a split, and the most splits per query and KV head (a split's keys
    # grow with the context past splits x split_keys: docs/backend-vulkan.md#attention-splits)
    "attention.split_keys": 32,
    "attention.splits": 64,
    "argmax.block": 4096,
    "matvec.max_tokens": 8,
    "matmul.coop": 1,
    # projections with fewer input columns take the fp32 GEMM even where matmul.coop is on: at such K a prefill
    # projection is launch-bound, so rounding its inputs to fp16 buys nothing (tiny test models, not Gemma's
    # sizes: the smallest hidden size is 640)
    "matmul.coop_min_k": 256,
    # the cooperative-matrix GEMM reads its input as fp16, converted once per input (eltwise.comp OP_TO_F16):
    # half the bytes and registers of fp32 loads, no conversion per tile (the same fp16 values: the kernel
    # rounds X to fp16 either way); 0: fp32 loads (docs/backend-vulkan.md#prefill-gemm)
    "matmul_coop.x16": 1,
    "matvec.norm_rows": 65536,
    "attention.fused_combine": 0,  # the separate merge measured faster (docs/backend-vulkan.md#single-stream)
    "attention.kv_in_rope": 1,
    "matvec.post_norm": 1,
    # the post-norm tail of a one-token step holds its row in registers (every load issued at once) instead
    # of looping over it (docs/backend-vulkan.md#post-norm-tail)
    "matvec.tail_regs": 1,
    "matvec.fp16": 0,  # fp16 products in the decode matvec (devices with shaderFloat16)
    "matvec.norm_ms": 1,  # fused norms read the mean squares their input's post-norm tail wrote (MS_IN)
    # int8 activations and integer dot products in the decode matvec (quant_act.comp + Q8_ACT); the default
    # is 1 where the device accelerates 4x8-bit dot products and the model's hidden size is at least
    # matvec.q8_min_hidden (set by Tuning: below it the quantizing dispatches cost more than the smaller
    # reads save; figures: docs/backend-vulkan.md), else 0
    "matvec.q8": 0,
    "matvec.q8_min_hidden": 2048,
    "matvec.q8_rows": 1,  # rows per group of threads of the integer matvec in one-token steps
    # weight units a thread of the integer matvec loads before it uses any (1 or 2: more bytes in flight)
    "matvec.q8_ahead": 1,
    "matvec.quant_out": 1,  # a post-norm tail writes the next projection's int8 input (no quant_act of its own)
    # Q4_K units of the integer matvec: 64 columns (all 32 bytes of a sub-block pair, each activation block
    # meta loaded serving twice the weight bytes) in 1: single projections, 2: every one (gate/up pairs too);
    # 0: 32-column units everywhere. 2 measured fastest (docs/backend-vulkan.md#q4_k-in-64-column-units)
    "matvec.q4k_wide": 2,
    # float16 keys and values in the KV cache (16-bit storage buffers; products stay float32): half the
    # cache's memory and attention's reads, at fp16 rounding of K and V. Off by default: its 16-bit loads are
    # scalar, and it measured slower (docs/backend-vulkan.md#at-the-familys-sizes-and-the-integer-matvec)
    "kv.fp16": 0,
    # Gemma 3n (docs/backend-vulkan.md#gemma-3n): workgroups per token of altup_predict/altup_correct (each
    # recomputes the 4-value router, then takes a slice of the columns)
    "altup.split": 4,
    # sparse layers: the up projection computes only the rows the Gaussian top-k kept and the down
    # projection skips the zero chunks of its input (0: the dense twin, every row and column)
    "ffn.sparse_skip": 1,
    # with ffn.sparse_skip: the down projection reads a transposed copy of the weight (units as rows), only the
    # kept units' rows: 1 float16, 2 float32 (exact; twice the bytes), 0 the row-major weight with zero chunks
    # skipped; ffn.down_split workgroup rows share the units. 0 by default: it measured fastest, and the
    # copies cost memory (docs/backend-vulkan.md#gemma-3n)
    "ffn.down_t": 0,
    "ffn.down_split": 16,
    # the per-layer-embedding table (E2B: 262,144 x 7,680) in host-visible memory, read one row per token,
    # leaving the device-local heap to the weights that are streamed (0: placed like any other weight)
    "ple.host": 1,
    # Gemma 3n: the post-attention and LAuReL post-norms folded into laurel_residual, the PLE post-norm into
    # ple_inject, the PLE gate into its projection's matvec (0: each its own dispatch)
    "gemma3n.fuse": 1,
}
SWITCHES = (
    "matmul.coop",
    "matmul_coop.ahead",
    "matmul_coop.x16",
    "attention.fused_combine",
    "attention.kv_in_rope",
    "matvec.post_norm",
    "matvec.tail_regs",
    "matvec.fp16",
    "matvec.norm_ms",
    "matvec.q8",
    "matvec.quant_out",
    "kv.fp16",
    "ffn.sparse_skip",
    "ple.host",
    "gemma3n.fuse",
)
ROW_THREAD_KEYS = (
    "matvec.row_threads",
    "matvec.row_threads_tall",
    "matvec.row_threads_batch",
    "matvec.q8_row_threads",  # threads per row of the integer matvec in one-token steps
)
# every kernel tunable: the specialization constants of KERNELS, the per-shape matvec row widths, PROGRAM_TUNABLES
TUNABLE_NAMES = (
    *(f"{k}.{name}" for k, spec in KERNELS.items() for name, _ in spec.tunables),
    *ROW_THREAD_KEYS[1:],
    "matvec.row_block_tall",
    "matvec.row_block_batch",
    "matvec.batch_chunks",
    "matvec.wg_tall",
    *PROGRAM_TUNABLES,
)


class Tuning:
    """Resolved tunables for one device: defaults adapted to the device, overridden by ``--tune`` values."""

    def __init__(self, feats: DeviceFeatures, overrides: dict[str, str] | None = None, hidden: int = 0):
        """``hidden``: the model's hidden size (0: unknown), which the default of ``matvec.q8`` depends on."""
        sg = max(feats.subgroup_size, 1)
        wide = max(32, sg)
        coop_sg = coop_subgroups(feats)
        self.values: dict[str, int] = {
            "matvec.wg": max(256, wide),
            "matvec.row_threads": 4 * wide,
            "matvec.row_threads_tall": min(16, wide),
            "matvec.row_threads_batch": 0,
            "matvec.q8_row_threads": wide,  # steps of 2..8 tokens; 0: from K and matvec.batch_chunks
            "matvec.batch_chunks": 1,  # 8-column chunks per thread in steps of 2..8 tokens (sets the above)
            "matvec.row_block_tall": 4,  # rows per thread group of the LM head in steps of 2..8 tokens
            # rows per thread group of the other weights in steps of 2..8 tokens: 2 beat 1, 3 and 4
            # (docs/backend-vulkan.md#batched-decode)
            "matvec.row_block_batch": 2,
            "matvec.wg_tall": 0,  # workgroup size of the LM head's matvec (0: matvec.wg)
            "matmul.wg": 256,
            "matmul.wg_m": 16,
            "matmul.tm": 4,
            "matmul.tn": 4,
            # 16 subgroups of 2x2 16x16 tiles (a 128x128 tile), 64 K columns per step: near the tuner's winners
            # at the 27B shapes (docs/backend-vulkan.md#prefill-gemm); fewer where a workgroup cannot be so large
            "matmul_coop.wg": coop_sg * sg,
            "matmul_coop.wm": min(4, coop_sg),
            "matmul_coop.tm": 2,
            "matmul_coop.tn": 2,
            "matmul_coop.bk": 64,  # K columns staged per step (32 or 64; 64 halves the barriers per K)
            # 1: a step's weights decoded between the previous step's products, not after them: faster at the
            # default tile on every shape measured (docs/backend-vulkan.md#prefill-gemm)
            "matmul_coop.ahead": 1,
            "attention.wg": max(256, sg),
            "attention.tile": 64,
            "attn_combine.wg": max(64, sg),
            "rmsnorm.wg": max(128, sg),
            "eltwise.wg": 128,
            "embed.wg": 64,
            "kv_store.wg": 128,
            "argmax.wg": 256,
            "gemma3n.wg": max(128, sg),
            "quant_act.wg": max(32, sg),  # one block of 32 values a thread: several small workgroups
            "stream_read.wg": max(256, sg),
            **PROGRAM_TUNABLES,
        }
        for key, text in (overrides or {}).items():
            if key not in self.values:
                raise ValueError(
                    f"vulkan backend: unknown tunable {key!r} (known: {', '.join(sorted(self.values))})"
                )
            try:
                self.values[key] = int(text)
            except ValueError:
                raise ValueError(f"vulkan backend: tunable {key}={text!r} is not an integer") from None
        if "matvec.q8" not in (overrides or {}):
            self.values["matvec.q8"] = int(
                feats.int_dot_fast and hidden >= self.values["matvec.q8_min_hidden"]
            )
        v = self.values
        coop = ("matmul_coop.wg", "matmul_coop.wm", "matmul_coop.tm", "matmul_coop.tn", "matmul_coop.bk")
        defaults = feats.coopmat_f16 and not any(k in (overrides or {}) for k in coop)
        # the default tile where this device's shared memory holds it: 32 K columns before 64, then fewer subgroups
        while (
            defaults
            and v["matmul_coop.wg"] > 2 * sg
            and coop_errors(*(v[k] for k in coop[:4]), feats, v[coop[4]])
        ):
            if v["matmul_coop.bk"] == 64:
                v["matmul_coop.bk"] = 32
            else:
                v["matmul_coop.wg"] //= 2
                v["matmul_coop.wm"] = min(v["matmul_coop.wm"], v["matmul_coop.wg"] // sg)
        if not self.values["matvec.wg_tall"]:
            self.values["matvec.wg_tall"] = self.values["matvec.wg"]
        for key in ROW_THREAD_KEYS:
            if key not in (overrides or {}):  # defaults follow a smaller matvec.wg
                self.values[key] = min(self.values[key], self.values["matvec.wg"])
        self.validate(feats)

    def __getitem__(self, key: str) -> int:
        return self.values[key]

    def spec(self, kernel: str) -> list[tuple[int, int]]:
        return [(cid, self.values[f"{kernel}.{name}"]) for name, cid in KERNELS[kernel].tunables]

    def validate(self, f: DeviceFeatures) -> None:
        """Reject combinations the device cannot run (before any dispatch)."""
        v, sg = self.values, f.subgroup_size
        errors = []
        for key, val in v.items():
            if key in SWITCHES and val not in (0, 1):
                errors.append(f"{key}={val} must be 0 or 1")
            elif (
                val < 1
                and key not in SWITCHES
                and key not in ("matvec.row_threads_batch", "matvec.wg_tall", "ffn.down_t", "matvec.q4k_wide")
            ):
                errors.append(f"{key}={val} must be positive")
            if key.endswith((".wg", ".wg_tall")) and (
                val > f.max_invocations or val > f.max_workgroup_size[0]
            ):
                errors.append(
                    f"{key}={val} exceeds the device's {f.max_invocations} invocations per workgroup"
                )
            if key.endswith((".wg", ".wg_tall")) and val % sg:
                errors.append(f"{key}={val} is not a multiple of the subgroup size {sg}")
        if v["matvec.wg_tall"] % v["matvec.row_threads_tall"]:
            errors.append("matvec.row_threads_tall must divide matvec.wg_tall")
        for key in ROW_THREAD_KEYS:
            rt = v[key]
            if rt == 0 and key == "matvec.row_threads_batch":
                continue  # chosen per weight from its width
            if rt < 0 or rt & (rt - 1) or (rt > sg and rt % sg) or v["matvec.wg"] % rt:
                errors.append(
                    f"{key}={rt} must be a power of two, a multiple of the subgroup size {sg} when "
                    "larger than it, and divide matvec.wg"
                )
        nw = v["attention.wg"] // sg
        if v["attention.tile"] % max(nw, 1) or v["attention.tile"] > 256:
            errors.append(
                f"attention.tile must be a multiple of attention.wg / subgroup size ({nw}) and <= 256"
            )
        if v["matmul.wg"] % v["matmul.wg_m"]:
            errors.append("matmul.wg_m must divide matmul.wg")
        for key in ("matmul.tm", "matmul.tn"):
            if v[key] > 8:
                errors.append(f"{key}={v[key]} exceeds 8")
        bm = v["matmul.wg_m"] * v["matmul.tm"]
        bn = (v["matmul.wg"] // max(v["matmul.wg_m"], 1)) * v["matmul.tn"]
        shared = 32 * ((bm + 1) + (bn + 1)) * 4
        if shared > f.max_shared_memory:
            errors.append(
                f"matmul tile {bm}x{bn} needs {shared} B of shared memory (device: {f.max_shared_memory})"
            )
        if f.coopmat_f16:
            errors += coop_errors(
                v["matmul_coop.wg"],
                v["matmul_coop.wm"],
                v["matmul_coop.tm"],
                v["matmul_coop.tn"],
                f,
                v["matmul_coop.bk"],
            )
        if v["matvec.q8"] and not f.int_dot:
            errors.append("matvec.q8=1 needs shaderIntegerDotProduct (Vulkan 1.3), which this device lacks")
        if not 1 <= v["matvec.q8_rows"] <= 8:
            errors.append("matvec.q8_rows must be 1..8")
        if v["matvec.q8_ahead"] not in (1, 2):
            errors.append(f"matvec.q8_ahead={v['matvec.q8_ahead']} must be 1 or 2")
        if v["matvec.q4k_wide"] not in (0, 1, 2):
            errors.append(f"matvec.q4k_wide={v['matvec.q4k_wide']} must be 0, 1 or 2")
        if v["matvec.fp16"] and not f.fp16:
            errors.append("matvec.fp16=1 needs shaderFloat16, which this device lacks")
        if v["kv.fp16"] and not f.storage_16bit:
            errors.append(
                "kv.fp16=1 needs storageBuffer16BitAccess (16-bit storage buffers), which this device lacks"
            )
        for key in ("argmax.wg", "stream_read.wg"):  # their workgroup sums halve the workgroup
            if v[key] & (v[key] - 1):
                errors.append(f"{key} must be a power of two")
        for key in ("matvec.row_block_tall", "matvec.row_block_batch"):
            if not 1 <= v[key] <= 8:
                errors.append(f"{key} must be 1..8")
        if v["ffn.down_t"] not in (0, 1, 2):
            errors.append(
                "ffn.down_t must be 0 (row-major), 1 (float16 transposed) or 2 (float32 transposed)"
            )
        if not 1 <= v["matvec.max_tokens"] <= 8:
            errors.append("matvec.max_tokens must be 1..8")
        if v["attention.splits"] > min(65535, f.max_workgroup_count[0]):
            errors.append(f"attention.splits={v['attention.splits']} exceeds the device's grid width")
        if errors:
            raise ValueError("vulkan backend: invalid tunables: " + "; ".join(errors))


def batch_row_threads(v: dict[str, int], k: int, pair: bool = False) -> int:
    """Threads per row of the matvec in steps of 2..8 tokens for a weight of ``k`` columns: the tunable where
    set, else enough threads for ``matvec.batch_chunks`` 8-column chunks each (the power of two at or above
    that count; for a fused gate/up pair, with two weights' work per chunk, the one at or below), at most
    ``matvec.wg``. An 8-token step is latency bound: the widths that ran best per weight width are in
    docs/backend-vulkan.md#batched-decode."""
    if v["matvec.row_threads_batch"]:
        return v["matvec.row_threads_batch"]
    lanes = max(k // (8 * v["matvec.batch_chunks"]), 1)
    below = 1 << (lanes.bit_length() - 1)
    return min(below if pair or below == lanes else 2 * below, v["matvec.wg"])


COOP_BK = (32, 64)  # the K columns matmul_coop.comp can stage per step


def coop_subgroups(f: DeviceFeatures) -> int:
    """Subgroups of the default cooperative-matrix GEMM workgroup: 16 of 32 lanes (or fewer, wider ones)."""
    sg = max(f.subgroup_size, 1)
    n = 16 if sg <= 32 else 8
    while n > 1 and n * sg > min(f.max_invocations, f.max_workgroup_size[0]):
        n //= 2
    return n


def coop_tile(v: dict[str, int], subgroup_size: int) -> tuple[int, int]:
    """(BM, BN) of the cooperative-matrix GEMM for tunables ``v``."""
    subgroups = v["matmul_coop.wg"] // max(subgroup_size, 1)
    wn = subgroups // max(v["matmul_coop.wm"], 1)
    return v["matmul_coop.wm"] * v["matmul_coop.tm"] * 16, wn * v["matmul_coop.tn"] * 16


def coop_errors(wg: int, wm: int, tm: int, tn: int, f: DeviceFeatures, bk: int = 32) -> list[str]:
    """Why a cooperative-matrix GEMM tile (``matmul_coop`` wg, wm, tm, tn, bk) cannot run on device ``f``."""
    errors = [] if bk in COOP_BK else [f"matmul_coop.bk={bk} must be one of {COOP_BK}"]
    subgroups = wg // max(f.subgroup_size, 1)
    if wm < 1 or subgroups % wm:
        errors.append(f"matmul_coop.wm={wm} must divide the {subgroups} subgroups of matmul_coop.wg")
    for key, val in (("matmul_coop.tm", tm), ("matmul_coop.tn", tn)):
        if not 1 <= val <= 4:
            errors.append(f"{key}={val} must be 1..4")
    if errors:
        return errors
    bm, bn = wm * tm * 16, subgroups // wm * tn * 16
    shared = (bm + bn) * (bk + 8) * 2 + 256 * 4  # fp16 tiles + one 16x16 fp32 edge tile
    if shared > f.max_shared_memory:
        errors.append(
            f"matmul_coop tile {bm}x{bn} needs {shared} B of shared memory (device: {f.max_shared_memory})"
        )
    return errors


def all_variants() -> list[tuple[str, tuple[str, ...]]]:
    """Every (shader, defines) the backend can use (for building the SPIR-V cache ahead of time)."""
    out = []
    for f in FORMAT_DEFINES:
        for f16 in ((), ("F16_MATH",)):
            g = (*f, *f16)
            out += [("matvec", g), ("matvec", (*g, "GELU_PAIR")), ("matvec", (*g, "POST_NORM_ADD"))]
            out += [("matvec", (*g, "POST_NORM_ADD", "TAIL_REGS"))]
            out += [
                ("matvec", (*g, *pair, "NORM", *ms))
                for pair in ((), ("GELU_PAIR",))
                for ms in ((), ("MS_IN",))
            ]
            # Gemma 3n's sparse layers (ffn.sparse_skip): the gated up projection, the zero-skipping down
            out += [("matvec", (*g, "NORM", *ms, "SPARSE_UP")) for ms in ((), ("MS_IN",))]
            out += [
                ("matvec", (*g, *post, "SKIP_ZERO"))
                for post in ((), ("POST_NORM_ADD",), ("POST_NORM_ADD", "TAIL_REGS"))
            ]
            out += [("matvec", (*g, "GATE_MUL"))]
        if f[0].removeprefix("FMT_") in Q8_FORMATS:
            wide = ((), ("Q4K_WIDE",)) if f[0] == "FMT_Q4_K" else ((),)  # matvec.q4k_wide
            out += [
                ("matvec", (*f, "Q8_ACT", *v, *wv))
                for wv in wide
                for v in (
                    (),
                    ("GELU_PAIR",),
                    ("GELU_PAIR", "QUANT_ROWS"),
                    ("POST_NORM_ADD",),
                    ("POST_NORM_ADD", "QUANT_OUT"),
                    ("POST_NORM_ADD", "TAIL_REGS"),
                    ("POST_NORM_ADD", "QUANT_OUT", "TAIL_REGS"),
                    ("SPARSE_UP",),
                    ("GATE_MUL",),
                )
            ]
        out += [("matmul", f), ("matmul_coop", f), ("matmul_coop", (*f, "X_F16")), ("embed", f)]
    for kv in ((), ("KV_F16",)):  # the cache's float32 and float16 (kv.fp16) variants
        out += [("attention", kv), ("attention", ("FUSED_COMBINE", *kv)), ("kv_store", kv)]
        out += [("attention", ("FUSED_COMBINE", "QUANT_OUT", *kv))]
        out += [("rmsnorm", ("ROPE", "KV_OUT", *x, *kv)) for x in ((), ("NO_NORM",), ("V_NORM",))]
    out += [("attn_combine", ()), ("attn_combine", ("QUANT_OUT",)), ("rmsnorm", ()), ("rmsnorm", ("ADD",))]
    out += [("rmsnorm", ("ROPE", *x)) for x in ((), ("NO_NORM",))]
    out += [("eltwise", (f"OP_{op}",)) for op in ("ADD", "GELU_MUL", "SOFTCAP", "GATHER", "TO_F16")]
    out += [("argmax", ("PASS1",)), ("argmax", ())]
    out += [("rmsnorm", ("NO_WEIGHT",))] + [("gemma3n", (f"OP_{op}",)) for op in GEMMA3N_OPS]
    out += [("gemma3n", ("OP_DOWN_T", "DOWN_T_F32")), ("gemma3n", ("OP_ALTUP_PREDICT", "INJECT"))]
    out += [("quant_act", d) for d in ((), ("NORM",), ("NORM", "MS_IN"))]
    out += [("stream_read", ())]
    return out


class Pipelines:
    """One descriptor-set layout (6 storage-buffer bindings, the KV one an array) and push range shared by every kernel; pipelines cached
    by (shader, defines, specialization constants)."""

    N_BINDINGS = 6
    KV_BINDING = 4  # an array of KV_SEQS buffers
    N_DESCRIPTORS = N_BINDINGS - 1 + KV_SEQS

    def __init__(self, dev: VulkanDevice):
        vk = dev.vk
        self.dev = dev
        bindings = [
            vk.VkDescriptorSetLayoutBinding(
                binding=i,
                descriptorType=vk.VK_DESCRIPTOR_TYPE_STORAGE_BUFFER,
                descriptorCount=KV_SEQS if i == self.KV_BINDING else 1,
                stageFlags=vk.VK_SHADER_STAGE_COMPUTE_BIT,
            )
            for i in range(self.N_BINDINGS)
        ]
        self.set_layout = vk.vkCreateDescriptorSetLayout(
            dev.device,
            vk.VkDescriptorSetLayoutCreateInfo(bindingCount=len(bindings), pBindings=bindings),
            None,
        )
        push = vk.VkPushConstantRange(stageFlags=vk.VK_SHADER_STAGE_COMPUTE_BIT, offset=0, size=PUSH_BYTES)
        self.layout = vk.vkCreatePipelineLayout(
            dev.device,
            vk.VkPipelineLayoutCreateInfo(
                setLayoutCount=1,
                pSetLayouts=[self.set_layout],
                pushConstantRangeCount=1,
                pPushConstantRanges=[push],
            ),
            None,
        )
        self._modules: dict[tuple, Any] = {}
        self._pipelines: dict[tuple, Any] = {}

    def get(self, shader: str, defines: tuple[str, ...], spec: list[tuple[int, int]]):
        vk, dev = self.dev.vk, self.dev
        key = (shader, tuple(sorted(defines)), tuple(sorted(spec)))
        pipe = self._pipelines.get(key)
        if pipe is not None:
            return pipe
        mkey = key[:2]
        module = self._modules.get(mkey)
        if module is None:
            code = compile_shader(shader, mkey[1])
            module = self._modules[mkey] = vk.vkCreateShaderModule(
                dev.device, vk.VkShaderModuleCreateInfo(codeSize=len(code), pCode=code), None
            )
        entries = [
            vk.VkSpecializationMapEntry(constantID=cid, offset=4 * i, size=4)
            for i, (cid, _) in enumerate(key[2])
        ]
        data = vk.ffi.new("uint32_t[]", [v for _, v in key[2]] or [0])
        spec_info = vk.VkSpecializationInfo(
            mapEntryCount=len(entries), pMapEntries=entries or None, dataSize=4 * len(entries), pData=data
        )
        required = getattr(dev, "required_subgroup_size", 0)  # the `subgroup_size` tunable (device.py)
        size_info = vk.VkPipelineShaderStageRequiredSubgroupSizeCreateInfo(requiredSubgroupSize=required)
        stage = vk.VkPipelineShaderStageCreateInfo(
            pNext=size_info if required else None,
            stage=vk.VK_SHADER_STAGE_COMPUTE_BIT,
            module=module,
            pName="main",
            pSpecializationInfo=spec_info,
        )
        info = vk.VkComputePipelineCreateInfo(stage=stage, layout=self.layout)
        pipe = vk.vkCreateComputePipelines(dev.device, None, 1, [info], None)[0]
        self._pipelines[key] = pipe
        return pipe

    def destroy(self) -> None:
        vk, d = self.dev.vk, self.dev.device
        if d is None:
            return
        for p in self._pipelines.values():
            vk.vkDestroyPipeline(d, p, None)
        for m in self._modules.values():
            vk.vkDestroyShaderModule(d, m, None)
        vk.vkDestroyPipelineLayout(d, self.layout, None)
        vk.vkDestroyDescriptorSetLayout(d, self.set_layout, None)
        self._pipelines.clear()
        self._modules.clear()
