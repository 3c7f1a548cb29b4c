"""``python -m workbench.backends.vulkan``: build every shader variant into the SPIR-V cache."""

import sys

from .shaders import main

sys.exit(main())
