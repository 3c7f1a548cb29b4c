"""``workbench calibrate npu``: the NPU emulator's estimates beside the published figures they match."""

from __future__ import annotations

import argparse

from .common import add_json_arg


def add_parser(sub) -> None:
    p = sub.add_parser(
        "calibrate",
        help="compare the NPU emulator's cost model with published NPU measurements",
        description="For each published figure: the emulator's estimate of the same design, the source and "
        "the relative error (target: within 25%). Estimates are emulated, never measured.",
    )
    p.add_argument("target", choices=["npu"], help="what to calibrate (npu: the AIE emulator's cost model)")
    add_json_arg(p)
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from ..backends.npu.calibration import calibration_table
    from . import emit_json

    table = calibration_table()
    if args.json:
        emit_json(table)
        return 0
    print(f"NPU emulator vs published figures ({table['how']}; target |error| <= {table['tolerance']:.0%})")
    for title, key in (
        ("calibrated against", "calibration"),
        ("checked against (no factor set from them)", "checks"),
    ):
        print(f"\n{title}:")
        for r in table[key]:
            print(
                f"  {r['figure']:<48} {r['device']:<6} published {r['published']:>8.1f} {r['unit']:<4} "
                f"emulated {r['estimate']:>8.1f}  error {r['rel_error']:+7.1%}  ({r['bound']})"
            )
            print(f"      source: {r['source']}")
            if r["notes"]:
                print(f"      note: {r['notes']}")
    print(f"\nall rows within {table['tolerance']:.0%}: {table['all_within']}")
    return 0 if table["all_within"] else 1
