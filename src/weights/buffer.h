// Tensor buffers for src/weights' own use (not part of the layer's interface).
#pragma once

#include <cstddef>
#include <memory>

namespace parsyn::weights::internal {

// A zero-filled buffer of at least one byte, 64-byte aligned. From 1 MiB up it is mapped with its pages populated
// in one call: touching fresh pages one 4 KiB fault at a time cost ~1.5 ms per MiB on the VMs this was tuned on,
// about 1.6x the populated mapping, and a memset on top would write every byte twice. The mapping starts on a 2 MiB
// boundary and asks for transparent huge pages (MADV_HUGEPAGE), which the kernel clears 2 MiB at a time: populating
// 256 MiB took 26 ms instead of 110 ms, and unmapping it 1 ms instead of 25 ms. Throws std::bad_alloc when memory is
// exhausted, as operator new does.
std::shared_ptr<std::byte> AllocateZeroedBuffer(size_t size_bytes);

// The alignment of AllocateZeroedBuffer, and `size_bytes` rounded up to it (so tensors laid out one after another in
// one buffer each start aligned).
inline constexpr size_t kBufferAlignment = 64;
constexpr size_t AlignedSize(size_t size_bytes) {
  return (size_bytes + kBufferAlignment - 1) / kBufferAlignment * kBufferAlignment;
}

}  // namespace parsyn::weights::internal
