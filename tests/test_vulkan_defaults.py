"""The Vulkan backend's default tunables follow the device's limits (no device needed: described devices)."""

from __future__ import annotations

import dataclasses

import pytest

from workbench.backends.vulkan.device import DeviceFeatures
from workbench.backends.vulkan.kernels import Tuning, coop_errors, coop_tile


def features(**kw) -> DeviceFeatures:
    zero = {f.name: 0 for f in dataclasses.fields(DeviceFeatures) if f.default is dataclasses.MISSING}
    base = dict(name="described GPU", type="discrete", subgroup_size=32, min_subgroup_size=32,
                max_subgroup_size=32, fp16=True, int8=True, storage_8bit=True, storage_16bit=True,
                cooperative_matrix=True, coopmat_f16=True, max_shared_memory=49152, max_invocations=1024,
                max_workgroup_size=(1024, 1024, 64), max_workgroup_count=(65535, 65535, 65535),
                max_push_constants=256, max_storage_buffer_range=1 << 30)  # fmt: skip
    return DeviceFeatures(**{**zero, **base, **kw})


def coop(t: Tuning) -> tuple[int, ...]:
    return tuple(t[f"matmul_coop.{k}"] for k in ("wg", "wm", "tm", "tn", "bk"))


def test_default_gemm_tile_is_128_square_with_64_columns_where_it_fits():
    f = features()
    t = Tuning(f)
    assert coop(t) == (512, 4, 2, 2, 64)
    assert coop_tile(t.values, 32) == (128, 128)
    assert not coop_errors(512, 4, 2, 2, f, 64)


@pytest.mark.parametrize("shared", [32768, 24576])
def test_default_gemm_tile_stages_32_columns_where_shared_memory_is_small(shared):
    """64 columns of a 128x128 tile need ~38 KB; a device with less gets 32 (~21 KB), not a failing default."""
    t = Tuning(features(max_shared_memory=shared))
    assert coop(t)[-1] == 32


def test_default_gemm_workgroup_fits_the_device():
    """Wide subgroups (wave64) take 8 of them; a device capped at 256 invocations gets a smaller workgroup."""
    assert coop(Tuning(features(subgroup_size=64, min_subgroup_size=64, max_subgroup_size=64)))[:2] == (
        512,
        4,
    )
    wg, wm = coop(Tuning(features(max_invocations=256)))[:2]
    assert wg <= 256 and (wg // 32) % wm == 0


def test_forced_gemm_tile_beyond_shared_memory_is_rejected():
    with pytest.raises(ValueError, match="shared memory"):
        Tuning(features(max_shared_memory=32768), {"matmul_coop.bk": "64"})


@pytest.mark.parametrize(
    "kw",
    [
        dict(subgroup_size=64, min_subgroup_size=32, max_subgroup_size=64, max_shared_memory=65536),  # RADV
        dict(subgroup_size=32, min_subgroup_size=8, max_subgroup_size=32, coopmat_f16=False),  # Intel-like
        dict(subgroup_size=8, min_subgroup_size=8, max_subgroup_size=8, cooperative_matrix=False,
             coopmat_f16=False, max_shared_memory=32768),  # lavapipe, 256-bit
        dict(subgroup_size=16, min_subgroup_size=16, max_subgroup_size=16, max_invocations=512),
    ],
)  # fmt: skip
def test_defaults_are_valid_on_described_devices(kw):
    """Every default must pass the backend's own checks whatever the subgroup size (wave64 included)."""
    Tuning(features(**kw))


def test_tuning_entries_of_another_kernel_version_are_reported_not_applied(tmp_path):
    """An entry records the hash of its kernel's source; after the shader changes it no longer applies
    (counted), while entries written before hashes were recorded still apply (counted as unversioned)."""
    from workbench.backends.vulkan.shaders import source_hash
    from workbench.backends.vulkan.tuned import TuningDB, driver_of

    f = features()
    params = {"wg": 256, "row_threads": 32, "rows": 1}
    db = TuningDB(tmp_path / "db.json")
    db.put(f, "matvec/Q4_K/q8/2048x5376/t1", params, {"us": 1.0})
    assert db.entries[0]["kernel"] == source_hash("matvec") != source_hash("matmul_coop")
    base = {"device": f.name, "driver": driver_of(f), "params": params}
    db.entries += [
        {**base, "key": "matvec/Q4_K/q8/4096x5376/t1", "kernel": "0" * 16},  # an older matvec.comp
        {**base, "key": "matvec/Q6_K/q8/2048x5376/t1"},  # written before entries recorded versions
    ]
    db.save()
    applied = TuningDB.load(db.path).for_device(f)
    assert set(applied.params) == {"matvec/Q4_K/q8/2048x5376/t1", "matvec/Q6_K/q8/2048x5376/t1"}
    info = applied.describe()
    assert (
        info["ignored_other_kernel"] == 1 and info["unversioned"] == 1 and info["ignored_other_driver"] == 0
    )


def test_default_gemm_tile_shrinks_where_even_32_columns_do_not_fit():
    """A device with 20 KB of shared memory gets a smaller default tile, not an error."""
    f = features(max_shared_memory=20480)
    t = Tuning(f)
    wg, wm, tm, tn, bk = coop(t)
    assert bk == 32 and wg < 512 and not coop_errors(wg, wm, tm, tn, f, bk)


def test_tune_drops_an_older_entry_when_the_default_wins(tmp_path):
    from workbench.backends.vulkan.tuned import TuningDB

    f = features()
    db = TuningDB(tmp_path / "db.json")
    db.put(f, "matvec/Q4_K/q8/2048x5376/t1", {"wg": 256, "row_threads": 32, "rows": 1}, {"us": 1.0})
    db.put(f, "matvec/Q4_K/q8/4096x5376/t1", {"wg": 256, "row_threads": 32, "rows": 1}, {"us": 1.0})
    db.remove(f, "matvec/Q4_K/q8/2048x5376/t1")
    db.remove(features(name="another GPU"), "matvec/Q4_K/q8/4096x5376/t1")  # another device's: kept
    assert [e["key"] for e in db.entries] == ["matvec/Q4_K/q8/4096x5376/t1"]


def test_gemm_decode_ahead_is_a_switch_per_device_and_per_shape():
    """``matmul_coop.ahead`` (decode step k+1's weights between step k's products) is 0 or 1, as a tunable
    and as a tuned shape's parameter; anything else is refused before a pipeline is built."""
    from workbench.backends.vulkan.tuned import param_errors

    f = features()
    with pytest.raises(ValueError, match=r"matmul_coop\.ahead=2 must be 0 or 1"):
        Tuning(f, {"matmul_coop.ahead": "2"})
    tile = {"wg": 512, "wm": 4, "tm": 2, "tn": 2, "bk": 64}
    assert not param_errors("matmul_coop", {**tile, "ahead": 1}, f)
    assert not param_errors("matmul_coop", tile, f)  # entries tuned before the parameter existed
    assert param_errors("matmul_coop", {**tile, "ahead": 3}, f) == ["ahead=3 must be 0 or 1"]
