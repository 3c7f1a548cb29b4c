"""``python -m workbench.backends.vulkan``: build every shader variant into the SPIR-V cache."""

import sys

from .kernels import all_variants
from .shaders import compile_shader, spirv_cache


def main() -> int:
    """Build every shader variant the backend uses into the SPIR-V cache (for machines without a compiler)."""
    variants = all_variants()
    for name, defines in variants:
        compile_shader(name, defines)
    print(f"{len(variants)} shader variants in {spirv_cache()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
