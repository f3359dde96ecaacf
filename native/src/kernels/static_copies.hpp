// Values a kernel derives from weights in static storage (OpInstr::static_inputs) and keeps
// between runs: oneDNN's reordered weights, Winograd's transformed weights. Static bytes change
// only with the engine's weights epoch, so a copy made at the current epoch from the same arena
// is current. Each arena (replica) has its own copy, since replicas may hold different weights.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <memory>
#include <new>
#include <utility>
#include <vector>

#include "../engine.hpp"

namespace popxl {

class StaticCopies {
 public:
  StaticCopies() = default;
  explicit StaticCopies(size_t bytes) : bytes_(bytes) {}

  // The copy kept for `owner` (an arena, or a tensor in one) and whether the caller must make it
  // now: it was made at another epoch, or never, or there is no epoch (a kernel run outside an
  // engine makes it every run). The copy counts as current from here on. A new owner takes over
  // a copy not made at the current epoch: every attach moves the epoch on, so released arenas'
  // copies are reused and there are never more copies than replicas.
  std::pair<void*, bool> copy_for(const void* owner, const uint64_t* epoch) {
    const uint64_t now = epoch ? *epoch : 0;
    Copy* use = nullptr;
    for (Copy& c : copies_)
      if (c.owner == owner) use = &c;
    if (!use)
      for (Copy& c : copies_)
        if (c.epoch != now) use = &c;
    if (!use) {
      copies_.emplace_back();
      use = &copies_.back();
      use->data.reset(std::aligned_alloc(ScratchLayout::kAlign, ScratchLayout::aligned(bytes_)));
      if (!use->data) throw std::bad_alloc();
    }
    const bool stale = !epoch || use->owner != owner || use->epoch != now;
    use->owner = owner;
    use->epoch = now;
    return {use->data.get(), stale};
  }

 private:
  struct Free { void operator()(void* p) const { std::free(p); } };
  struct Copy {
    std::unique_ptr<void, Free> data;
    const void* owner = nullptr;
    uint64_t epoch = 0;  // the weights epoch it was made at (epochs start at 1: 0 is never)
  };
  size_t bytes_ = 0;
  std::vector<Copy> copies_;
};

}  // namespace popxl
