"""The Vulkan streaming-bandwidth probe (``workbench.backends.vulkan.bandwidth``): it reads every word of its
buffer (checked by the sum the shader writes, run after run), in device-local and host-visible memory, and a
benchmark on the Vulkan backend records it with the decode projections' share of it.
"""

from __future__ import annotations

import pytest
from test_vulkan import REASON, vulkan_engine
from tiny import write_tiny_gguf

import workbench as wb
from workbench.backends.vulkan.bandwidth import measure_stream_read, probe_words
from workbench.bench.harness import projection_shares

pytestmark = pytest.mark.skipif(bool(REASON), reason=f"VULKAN TESTS SKIPPED: {REASON}")


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    e = vulkan_engine(wb.load(str(write_tiny_gguf(tmp_path_factory.mktemp("bw") / "tiny.gguf"))))
    yield e
    e.close()


@pytest.mark.parametrize("role", ["device", "host"])
def test_probe_reads_every_word_and_reports_bandwidth(engine, role):
    bw = measure_stream_read(engine.backend, mib=2, runs=3, role=role)
    d = bw.to_dict()
    assert d["role"] == role and d["runs"] == 3 and d["mib"] == 2
    assert 0 < bw.median_gbs <= bw.best_gbs
    assert "measured" in d["how"]


def test_probe_words_have_no_equal_neighbours():
    w = probe_words(1 << 16)
    assert (w[1:] != w[:-1]).all() and len(set(w[:4096].tolist())) == 4096


def test_probe_rejects_bad_sizes(engine):
    with pytest.raises(ValueError, match="must be positive"):
        measure_stream_read(engine.backend, mib=0)


def test_projection_shares_of_a_profile():
    import pandas as pd

    ops = pd.DataFrame(
        {
            "kind": ["rmsnorm_matmul", "rmsnorm_matmul", "attention", "matmul_rmsnorm_add"],
            "bytes_read": [4e9, 2e9, 1e9, 3e9],
            "time_s": [2.0, 1.0, 1.0, 3.0],
        }
    )
    got = projection_shares(ops, {"best_gbs": 4.0})
    assert got["gbps"] == pytest.approx(1.5) and got["share"] == pytest.approx(0.375)
    assert [r["kind"] for r in got["by_kind"]] == ["matmul_rmsnorm_add", "rmsnorm_matmul"]
    assert got["by_kind"][1]["share"] == pytest.approx(0.5)
    assert projection_shares(ops, None)["share"] is None
    assert projection_shares(ops[ops.kind == "attention"], None) == {}
