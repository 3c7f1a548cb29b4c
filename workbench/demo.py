"""``make demo``: the main job on the bundled default model."""

from __future__ import annotations

import sys
import time


def main() -> int:
    import workbench as wb

    t0 = time.perf_counter()
    model = wb.load("gemma3-270m")
    print(f"loaded {model.name} from {model.source} in {time.perf_counter() - t0:.2f} s")
    engine = wb.Engine(model, "auto")
    print(f"backend: {engine.backend.name} on {engine.backend.device.label()}")
    prompt = "The capital of France is"
    print(f"\nprompt: {prompt!r}\n")
    result = engine.generate(prompt, max_tokens=32, on_text=lambda s: print(s, end="", flush=True))
    print(
        f"\n\nprefill {result.prefill_tok_s:.1f} tok/s, decode {result.decode_tok_s:.1f} tok/s "
        f"(measured on {result.device}, host wall clock)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
