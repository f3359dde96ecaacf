// The engine's own thread team: every multi-threaded kernel splits its work with these functions.
//
// Why not OpenMP's: libgomp decides once, at load, how long an idle thread spins before it sleeps.
// Long spins are good on an idle machine (the engine's regions follow each other within
// microseconds, and a sleeping vCPU is slow to wake) and ruinous on a busy one (a thread spinning at
// a barrier takes the core its partner needs). This team spins only while a run is under way
// (`HotScope`, set by Engine::run) and gives the core away (sched_yield) while it spins, so that a
// thread of ours or of another process that shares the core runs first; outside runs it sleeps
// after ~20 us. oneDNN keeps libgomp's team; only the count of threads is shared: OpenMP's setting
// (OMP_NUM_THREADS, omp_set_num_threads), so the user has one knob for both.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <limits>
#include <type_traits>

namespace popxl {
namespace threads {

// Threads a region may use: OpenMP's setting on the calling thread.
int max_threads();

// A callable's address and a function that calls it: a region's work, without std::function's
// allocation.
struct Work {
  const void* fn;
  void (*call)(const void* fn, int id, int team);
};

// Runs work(id, team) for id in [0, team) on `team` threads (the caller is id 0) and returns when all
// have finished; team <= 1, or a call from inside a region, runs work(0, 1) on the caller. The first
// exception any thread throws is rethrown here, after every thread has finished.
void run_region(int team, const Work& work);

// fn(id, team) on max_threads() threads, or on at most `team` if given (a kernel's per-thread
// buffers are made for a count); on the caller alone (fn(0, 1)) unless `parallel`.
template <class F>
void region(F&& fn, bool parallel = true, int team = 0) {
  auto call = [](const void* f, int id, int n) { (*static_cast<const std::remove_reference_t<F>*>(f))(id, n); };
  int size = 1;  // not parallel: the caller alone, without asking OpenMP for its count
  if (parallel) size = team > 0 ? std::min(team, max_threads()) : max_threads();
  run_region(size, Work{&fn, call});
}

// Thread `id` of `team`'s share of [0, n), to loop over: contiguous and as even as can be (OpenMP's
// static schedule). `for (int64_t i : share(n, id, team))`.
struct Share {
  struct Index {
    int64_t i;
    int64_t operator*() const { return i; }
    Index& operator++() {
      ++i;
      return *this;
    }
    bool operator!=(const Index& o) const { return i != o.i; }
  };
  int64_t first, last;
  Index begin() const { return {first}; }
  Index end() const { return {last}; }
};
inline Share share(int64_t n, int id, int team) { return {n * id / team, n * (id + 1) / team}; }

// fn(i) for every i in [0, n), each thread a contiguous share; on the caller alone unless `parallel`
// and n > 1. `team`: at most that many threads (0: max_threads()).
template <class F>
void for_each(int64_t n, F&& fn, bool parallel = true, int team = 0) {
  if (!parallel || n <= 1) {
    for (int64_t i = 0; i < n; ++i) fn(i);
    return;
  }
  const int64_t cap = team > 0 ? team : std::numeric_limits<int>::max();  // region caps it at max_threads()
  region([&](int id, int t) {
    for (int64_t i : share(n, id, t)) fn(i);
  }, true, int(std::min<int64_t>(cap, n)));
}

// Items handed out one at a time to whichever thread asks next (OpenMP's dynamic schedule): for work
// of uneven or unknown cost. Made before the region, shared by its threads.
class Dynamic {
 public:
  explicit Dynamic(int64_t n) : n_(n) {}
  // The next item, or -1 when none is left.
  int64_t next() {
    const int64_t i = next_.fetch_add(1, std::memory_order_relaxed);
    return i < n_ ? i : -1;
  }

 private:
  const int64_t n_;
  std::atomic<int64_t> next_{0};
};

// While one is alive on a thread, the idle threads of that thread's team wait for its next region
// busily (yielding the core to anyone else who wants it) for up to kHotSpinMicros, instead of
// sleeping after kColdSpinMicros. Engine::run holds one for the whole run.
class HotScope {
 public:
  HotScope();
  ~HotScope();
  HotScope(const HotScope&) = delete;
  HotScope& operator=(const HotScope&) = delete;
};

constexpr int64_t kHotSpinMicros = 2000;
constexpr int64_t kColdSpinMicros = 20;

}  // namespace threads
}  // namespace popxl
