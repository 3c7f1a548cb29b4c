"""GGML tensor types: ids, block sizes and bytes per block, as stored in GGUF files."""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum


class GGMLType(IntEnum):
    """Tensor type ids used by GGUF (ggml's ``enum ggml_type``)."""

    F32 = 0
    F16 = 1
    Q4_0 = 2
    Q4_1 = 3
    Q5_0 = 6
    Q5_1 = 7
    Q8_0 = 8
    Q8_1 = 9
    Q2_K = 10
    Q3_K = 11
    Q4_K = 12
    Q5_K = 13
    Q6_K = 14
    Q8_K = 15
    IQ2_XXS = 16
    IQ2_XS = 17
    IQ3_XXS = 18
    IQ1_S = 19
    IQ4_NL = 20
    IQ3_S = 21
    IQ2_S = 22
    IQ4_XS = 23
    I8 = 24
    I16 = 25
    I32 = 26
    I64 = 27
    F64 = 28
    IQ1_M = 29
    BF16 = 30
    TQ1_0 = 34
    TQ2_0 = 35


@dataclass(frozen=True)
class BlockFormat:
    """Storage of one type: ``block_elems`` values take ``block_bytes`` bytes."""

    type: GGMLType
    block_elems: int
    block_bytes: int

    @property
    def name(self) -> str:
        return self.type.name

    @property
    def bits_per_weight(self) -> float:
        return 8.0 * self.block_bytes / self.block_elems

    def nbytes(self, n_elems: int) -> int:
        """Bytes taken by ``n_elems`` values; ``n_elems`` must be a whole number of blocks."""
        if n_elems % self.block_elems:
            raise ValueError(
                f"{self.name}: {n_elems} values is not a multiple of the block size {self.block_elems}"
            )
        return n_elems // self.block_elems * self.block_bytes


QK_K = 256  # super-block size of the k-quants

# Every type GGUF files may hold, so that any file's index can be sized; which ones we can compute with
# is DEQUANTIZABLE below (and each backend's own list).
FORMATS: dict[GGMLType, BlockFormat] = {
    f.type: f
    for f in [
        BlockFormat(GGMLType.F32, 1, 4),
        BlockFormat(GGMLType.F16, 1, 2),
        BlockFormat(GGMLType.BF16, 1, 2),
        BlockFormat(GGMLType.F64, 1, 8),
        BlockFormat(GGMLType.I8, 1, 1),
        BlockFormat(GGMLType.I16, 1, 2),
        BlockFormat(GGMLType.I32, 1, 4),
        BlockFormat(GGMLType.I64, 1, 8),
        BlockFormat(GGMLType.Q4_0, 32, 18),
        BlockFormat(GGMLType.Q4_1, 32, 20),
        BlockFormat(GGMLType.Q5_0, 32, 22),
        BlockFormat(GGMLType.Q5_1, 32, 24),
        BlockFormat(GGMLType.Q8_0, 32, 34),
        BlockFormat(GGMLType.Q8_1, 32, 36),
        BlockFormat(GGMLType.Q2_K, QK_K, 84),
        BlockFormat(GGMLType.Q3_K, QK_K, 110),
        BlockFormat(GGMLType.Q4_K, QK_K, 144),
        BlockFormat(GGMLType.Q5_K, QK_K, 176),
        BlockFormat(GGMLType.Q6_K, QK_K, 210),
        BlockFormat(GGMLType.Q8_K, QK_K, 292),
        BlockFormat(GGMLType.IQ2_XXS, QK_K, 66),
        BlockFormat(GGMLType.IQ2_XS, QK_K, 74),
        BlockFormat(GGMLType.IQ3_XXS, QK_K, 98),
        BlockFormat(GGMLType.IQ1_S, QK_K, 50),
        BlockFormat(GGMLType.IQ4_NL, 32, 18),
        BlockFormat(GGMLType.IQ3_S, QK_K, 110),
        BlockFormat(GGMLType.IQ2_S, QK_K, 82),
        BlockFormat(GGMLType.IQ4_XS, QK_K, 136),
        BlockFormat(GGMLType.IQ1_M, QK_K, 56),
        BlockFormat(GGMLType.TQ1_0, QK_K, 54),
        BlockFormat(GGMLType.TQ2_0, QK_K, 66),
    ]
}


class UnsupportedQuantError(ValueError):
    """A tensor is stored in a type this code cannot compute with."""


def block_format(type_id: int, what: str = "tensor") -> BlockFormat:
    """The block format of a GGML type id, or a clear error naming ``what`` holds it."""
    try:
        return FORMATS[GGMLType(type_id)]
    except ValueError:
        raise UnsupportedQuantError(f"{what}: unknown GGML type id {type_id}") from None
    except KeyError:
        raise UnsupportedQuantError(
            f"{what}: GGML type {GGMLType(type_id).name} has no known block layout"
        ) from None
