"""Which ops of a model's graph form a layer's FFN block and its attention, by op name."""

from __future__ import annotations

import re

# the FFN block: ``blk.N.ffn*`` and ``blk.N.post_ffw*`` (norm, FFN, post-norm, residual)
FFN_OP = re.compile(r"^blk\.\d+\.(ffn|post_ffw)")
ATTN_OP = re.compile(r"^blk\.\d+\.attn$")
