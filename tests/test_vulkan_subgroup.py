"""The ``subgroup_size`` tunable: pipelines that require a subgroup size (VK_EXT_subgroup_size_control).

lavapipe has one size (8), so here the requirement can only be the driver's own size: the mechanics (the
feature enabled, the create-info chained, the validation layer clean, results unchanged) and the errors are
what is checked; choosing between sizes (RADV's 32 and 64) needs such a device.
"""

from __future__ import annotations

import numpy as np
import pytest
from tiny import write_tiny_gguf

import workbench as wb

vk_device = pytest.importorskip("workbench.backends.vulkan.device")


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    return wb.load(str(write_tiny_gguf(tmp_path_factory.mktemp("sg") / "tiny.gguf")))


@pytest.fixture(scope="module")
def device():
    try:
        devs = vk_device.list_devices()
    except Exception as e:  # no loader or no device: the Vulkan tests say why
        pytest.skip(f"no Vulkan device ({e})")
    return vk_device.select_device(devs, None)


def test_required_subgroup_size_runs_with_the_same_logits(device, tiny_model):
    if not device.subgroup_size_control:
        pytest.skip(f"{device.name} cannot require a subgroup size")
    size = device.subgroup_size
    tokens = [2, 10, 20, 30, 40, 50, 60, 70, 80, 90, 100, 110, 120]
    base = wb.Engine(tiny_model, "vulkan", validation=True)
    want = base.forward(base.new_sequence(), tokens, logits="all")
    base.backend.close()
    eng = wb.Engine(tiny_model, "vulkan", validation=True, tune=f"subgroup_size={size}")
    got = eng.forward(eng.new_sequence(), tokens, logits="all")
    assert eng.backend.device.details["subgroup_size_required"] is True
    assert eng.backend.dev.required_subgroup_size == size
    eng.backend.dev.check_validation()
    np.testing.assert_array_equal(got, want)
    eng.backend.close()


@pytest.mark.parametrize("size", [3, 12, 4096])
def test_a_size_outside_the_device_range_is_a_clear_error(device, tiny_model, size):
    with pytest.raises(ValueError, match=f"subgroup_size={size}"):
        wb.Engine(tiny_model, "vulkan", tune=f"subgroup_size={size}")


def test_subgroup_size_error_names_the_range(device):
    text = vk_device.subgroup_size_error(device, 3)
    assert "subgroup_size=3" in text and device.name in text
    assert vk_device.subgroup_size_error(device, 0) is None
