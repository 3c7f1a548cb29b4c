"""A program recorded into command buffers: descriptor sets, the arena, the logits readback, timestamps.

``run(tokens, positions, rows)`` writes the step's parameters into the host-visible params buffer, submits
the recorded command buffer (one submit, one fence wait) and returns nothing; the caller reads the logits
(``logits()``) or the device-sampled token (params word 3). ``timed=True`` submits the variant that brackets
every dispatch with timestamps, and ``op_times()`` gives device seconds per op.
"""

from __future__ import annotations

from collections import OrderedDict

import numpy as np

from .device import VulkanDevice
from .kernels import KV_SEQS, Pipelines
from .memory import Buffer
from .program import MAX_STEP_TOKENS, Dispatch, pack_push


class Recorded:
    def __init__(self, dev: VulkanDevice, pipes: Pipelines, dispatches: list[Dispatch], arena_floats: int,
                 params: Buffer, smalls: Buffer, dummy: Buffer, logits: tuple[int, int] | None,
                 timestamps: bool, seq_index: np.ndarray):  # fmt: skip
        vk = dev.vk
        self.dev, self.dispatches, self.params = dev, dispatches, params
        self.seq_index = seq_index  # per token row: which of binding 4's caches (p_seq); fixed per program
        self.arena = Buffer(dev, arena_floats * 4, name="activation arena", spill=True)
        self.readback = Buffer(dev, logits[1] * 4, host=True, name="logits readback") if logits else None
        self.logits_region = logits
        self._sets: dict[tuple, object] = {}
        combos = OrderedDict()
        for d in dispatches:
            combos[_set_key(d)] = (d.weight, d.weight2, d.kv)
        self.pool = vk.vkCreateDescriptorPool(
            dev.device,
            vk.VkDescriptorPoolCreateInfo(
                maxSets=len(combos),
                poolSizeCount=1,
                pPoolSizes=[
                    vk.VkDescriptorPoolSize(
                        type=vk.VK_DESCRIPTOR_TYPE_STORAGE_BUFFER,
                        descriptorCount=Pipelines.N_DESCRIPTORS * len(combos),
                    )
                ],
            ),
            None,
        )
        sets = vk.vkAllocateDescriptorSets(
            dev.device,
            vk.VkDescriptorSetAllocateInfo(
                descriptorPool=self.pool,
                descriptorSetCount=len(combos),
                pSetLayouts=[pipes.set_layout] * len(combos),
            ),
        )
        writes = []
        for ds, (key, (w, w2, kv)) in zip(sets, combos.items()):
            self._sets[key] = ds
            caches = [*kv, *[dummy] * (KV_SEQS - len(kv))]
            bufs = [[w or dummy], [self.arena], [params], [smalls], caches, [w2 or dummy]]
            for i, group in enumerate(bufs):
                writes.append(
                    vk.VkWriteDescriptorSet(
                        dstSet=ds,
                        dstBinding=i,
                        descriptorCount=len(group),
                        descriptorType=vk.VK_DESCRIPTOR_TYPE_STORAGE_BUFFER,
                        pBufferInfo=[
                            vk.VkDescriptorBufferInfo(buffer=b.handle, offset=0, range=b.size) for b in group
                        ],
                    )
                )
        vk.vkUpdateDescriptorSets(dev.device, len(writes), writes, 0, None)
        self.pipes = pipes
        n = len(dispatches) + 1
        self.query_pool = None
        if timestamps:
            self.query_pool = vk.vkCreateQueryPool(
                dev.device,
                vk.VkQueryPoolCreateInfo(queryType=vk.VK_QUERY_TYPE_TIMESTAMP, queryCount=n + 2),
                None,
            )
        cbs = vk.vkAllocateCommandBuffers(
            dev.device,
            vk.VkCommandBufferAllocateInfo(
                commandPool=dev.command_pool,
                level=vk.VK_COMMAND_BUFFER_LEVEL_PRIMARY,
                commandBufferCount=2 if timestamps else 1,
            ),
        )
        self.cmd = cbs[0]
        self._record(self.cmd, timed=False)
        self.cmd_timed = None
        if timestamps:
            self.cmd_timed = cbs[1]
            self._record(self.cmd_timed, timed=True)
        self._words = params.view(np.uint32)
        self._submit = [self.cmd]
        self._submit_timed = [self.cmd_timed]

    def _record(self, cb, timed: bool) -> None:
        vk = self.dev.vk
        vk.vkBeginCommandBuffer(cb, vk.VkCommandBufferBeginInfo())
        compute = vk.VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT
        barrier = vk.VkMemoryBarrier(
            srcAccessMask=vk.VK_ACCESS_SHADER_WRITE_BIT,
            dstAccessMask=vk.VK_ACCESS_SHADER_READ_BIT | vk.VK_ACCESS_SHADER_WRITE_BIT,
        )
        host_write = vk.VkMemoryBarrier(
            srcAccessMask=vk.VK_ACCESS_HOST_WRITE_BIT, dstAccessMask=vk.VK_ACCESS_SHADER_READ_BIT
        )
        vk.vkCmdPipelineBarrier(
            cb, vk.VK_PIPELINE_STAGE_HOST_BIT, compute, 0, 1, [host_write], 0, None, 0, None
        )
        n_q = len(self.dispatches) + 1
        if timed:
            vk.vkCmdResetQueryPool(cb, self.query_pool, 0, n_q)
            vk.vkCmdWriteTimestamp(cb, vk.VK_PIPELINE_STAGE_TOP_OF_PIPE_BIT, self.query_pool, 0)
        elif self.query_pool is not None:  # one pair around the whole step: its GPU time
            vk.vkCmdResetQueryPool(cb, self.query_pool, n_q, 2)
            vk.vkCmdWriteTimestamp(cb, vk.VK_PIPELINE_STAGE_TOP_OF_PIPE_BIT, self.query_pool, n_q)
        bound_pipe = bound_set = None
        for i, d in enumerate(self.dispatches):
            if d.barrier or timed:
                vk.vkCmdPipelineBarrier(cb, compute, compute, 0, 1, [barrier], 0, None, 0, None)
            pipe = self.pipes.get(d.kernel, d.defines, d.spec)
            if pipe is not bound_pipe:
                vk.vkCmdBindPipeline(cb, vk.VK_PIPELINE_BIND_POINT_COMPUTE, pipe)
                bound_pipe = pipe
            ds = self._sets[_set_key(d)]
            if ds is not bound_set:
                vk.vkCmdBindDescriptorSets(
                    cb, vk.VK_PIPELINE_BIND_POINT_COMPUTE, self.pipes.layout, 0, 1, [ds], 0, None
                )
                bound_set = ds
            data = pack_push(d)
            vk.vkCmdPushConstants(
                cb, self.pipes.layout, vk.VK_SHADER_STAGE_COMPUTE_BIT, 0, len(data), vk.ffi.from_buffer(data)
            )
            vk.vkCmdDispatch(cb, *d.groups)
            if timed:
                vk.vkCmdWriteTimestamp(cb, vk.VK_PIPELINE_STAGE_BOTTOM_OF_PIPE_BIT, self.query_pool, i + 1)
        if self.readback is not None:
            to_copy = vk.VkMemoryBarrier(
                srcAccessMask=vk.VK_ACCESS_SHADER_WRITE_BIT, dstAccessMask=vk.VK_ACCESS_TRANSFER_READ_BIT
            )
            vk.vkCmdPipelineBarrier(
                cb, compute, vk.VK_PIPELINE_STAGE_TRANSFER_BIT, 0, 1, [to_copy], 0, None, 0, None
            )
            off, n = self.logits_region
            vk.vkCmdCopyBuffer(
                cb,
                self.arena.handle,
                self.readback.handle,
                1,
                [vk.VkBufferCopy(srcOffset=off * 4, dstOffset=0, size=n * 4)],
            )
        if not timed and self.query_pool is not None:
            vk.vkCmdWriteTimestamp(cb, vk.VK_PIPELINE_STAGE_BOTTOM_OF_PIPE_BIT, self.query_pool, n_q + 1)
        to_host = vk.VkMemoryBarrier(
            srcAccessMask=vk.VK_ACCESS_SHADER_WRITE_BIT | vk.VK_ACCESS_TRANSFER_WRITE_BIT,
            dstAccessMask=vk.VK_ACCESS_HOST_READ_BIT,
        )
        vk.vkCmdPipelineBarrier(
            cb,
            compute | vk.VK_PIPELINE_STAGE_TRANSFER_BIT,
            vk.VK_PIPELINE_STAGE_HOST_BIT,
            0,
            1,
            [to_host],
            0,
            None,
            0,
            None,
        )
        vk.vkEndCommandBuffer(cb)

    def run(self, tokens: np.ndarray, positions: np.ndarray, rows: np.ndarray, timed: bool = False) -> None:
        p, s = self._words, MAX_STEP_TOKENS
        t, r = len(tokens), len(rows)
        p[0], p[1] = t, r
        if t == 1 and r == 1:  # a decode step: scalar writes are several times cheaper than slices
            p[4], p[4 + s], p[4 + 2 * s], p[4 + 4 * s] = int(tokens[0]), int(positions[0]), int(rows[0]), 0
        else:
            p[4 : 4 + t] = tokens
            p[4 + s : 4 + s + t] = positions
            p[4 + 2 * s : 4 + 2 * s + r] = rows
            p[4 + 4 * s : 4 + 4 * s + t] = self.seq_index
        self.dev.submit_and_wait(self._submit_timed if timed else self._submit)

    def logits(self, rows: int) -> np.ndarray:
        return self.readback.view(np.float32).reshape(rows, -1).copy()

    def tokens(self, rows: int) -> np.ndarray:
        """The device-sampled token of each logits row (greedy programs)."""
        base = 4 + 3 * MAX_STEP_TOKENS
        return self._words[base : base + rows].astype(np.int64)

    def last_token(self, rows: int) -> int:
        """The device-sampled token of the last logits row."""
        return int(self._words[4 + 3 * MAX_STEP_TOKENS + rows - 1])

    def _timestamps(self, first: int, count: int) -> np.ndarray:
        vk = self.dev.vk
        data = vk.ffi.new("uint64_t[]", count)
        vk.vkGetQueryPoolResults(
            self.dev.device, self.query_pool, first, count, count * 8, data, 8,
            vk.VK_QUERY_RESULT_64_BIT | vk.VK_QUERY_RESULT_WAIT_BIT,
        )  # fmt: skip
        ticks = np.frombuffer(vk.ffi.buffer(data, count * 8), dtype=np.uint64).astype(np.float64)
        return ticks * self.dev.features.timestamp_period_ns * 1e-9

    def dispatch_times(self) -> np.ndarray:
        """Device seconds of each dispatch of the last timed run."""
        return np.diff(self._timestamps(0, len(self.dispatches) + 1))

    def step_seconds(self) -> float | None:
        """GPU seconds of the last untimed run (first dispatch start to last end), where timestamps exist."""
        if self.query_pool is None:
            return None
        return float(np.diff(self._timestamps(len(self.dispatches) + 1, 2))[0])

    def destroy(self) -> None:
        vk, d = self.dev.vk, self.dev.device
        if d is None:
            return
        cbs = [c for c in (self.cmd, self.cmd_timed) if c is not None]
        vk.vkFreeCommandBuffers(d, self.dev.command_pool, len(cbs), cbs)
        if self.query_pool is not None:
            vk.vkDestroyQueryPool(d, self.query_pool, None)
        vk.vkDestroyDescriptorPool(d, self.pool, None)
        self.arena.destroy()
        if self.readback is not None:
            self.readback.destroy()


def _set_key(d: Dispatch) -> tuple:
    """The buffers a dispatch binds (its descriptor set)."""
    return id(d.weight), id(d.weight2), tuple(id(b) for b in d.kv)
