// The engine's thread team (threads.hpp): one per thread that starts regions, made at its first
// multi-threaded region and ended with that thread.
#include "threads.hpp"

#include <omp.h>
#include <pthread.h>
#include <sched.h>

#include <cctype>
#include <chrono>
#include <cstdlib>
#include <condition_variable>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

namespace popxl {
namespace threads {
namespace {

inline void cpu_pause() {
#if defined(__x86_64__) || defined(__i386__)
  _mm_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

// OpenMP's OMP_WAIT_POLICY, if the user set it, rules this team's idle threads too: "active" spins
// until the next region, however long, without giving the core away; "passive" sleeps at once.
enum class WaitPolicy { Default, Active, Passive };

WaitPolicy wait_policy() {
  static const WaitPolicy policy = [] {
    const char* v = std::getenv("OMP_WAIT_POLICY");
    if (!v) return WaitPolicy::Default;
    std::string s(v);
    for (char& c : s) c = char(std::tolower(static_cast<unsigned char>(c)));
    return s == "active" ? WaitPolicy::Active : s == "passive" ? WaitPolicy::Passive : WaitPolicy::Default;
  }();
  return policy;
}

thread_local bool t_in_region = false;  // a team's worker, or a caller running its own share
thread_local int t_hot = 0;             // HotScopes alive on this thread

// A thread's share of a region runs as OpenMP's nested regions do: one thread. A region started
// there runs on that thread alone, and so does OpenMP code (oneDNN's), whose own team would
// otherwise put more threads than cores to work.
class InRegion {
 public:
  InRegion() : openmp_threads_(omp_get_max_threads()) {
    t_in_region = true;
    if (openmp_threads_ > 1) omp_set_num_threads(1);
  }
  ~InRegion() {
    t_in_region = false;
    if (openmp_threads_ > 1) omp_set_num_threads(openmp_threads_);
  }

 private:
  const int openmp_threads_;
};

class Team {
 public:
  // Throws std::system_error when the system has no more threads to give (none are left behind).
  explicit Team(int size) : size_(size) {
    hot_ = t_hot > 0;
    threads_.reserve(size_t(size - 1));
    try {
      for (int id = 1; id < size; ++id) threads_.emplace_back([this, id] { serve(id); });
    } catch (...) {
      stop();
      throw;
    }
  }

  ~Team() { stop(); }

  int size() const { return size_; }
  void set_hot(bool hot) { hot_.store(hot, std::memory_order_relaxed); }

  void run(int team, const Work& work) {
    work_ = &work;
    team_ = team;
    error_ = nullptr;
    pending_.store(size_ - 1);
    generation_.fetch_add(1);  // publishes work_ and team_ to the workers
    if (sleepers_.load() > 0) {
      std::lock_guard<std::mutex> lock(mu_);
      wake_.notify_all();
    }
    std::exception_ptr own;
    {
      InRegion in_region;
      try {
        work.call(work.fn, 0, team);
      } catch (...) {
        own = std::current_exception();
      }
    }
    if (!spin([&] { return pending_.load() == 0; })) {
      std::unique_lock<std::mutex> lock(mu_);
      caller_sleeping_ = true;
      done_.wait(lock, [&] { return pending_.load() == 0; });
      caller_sleeping_ = false;
    }
    if (own) std::rethrow_exception(own);
    if (error_) std::rethrow_exception(error_);
  }

 private:
  // Waits busily until done() holds, giving the core to any other runnable thread every few
  // microseconds; false once the wait has lasted longer than the current spin allowance (never
  // under OMP_WAIT_POLICY=active; at once under passive).
  template <class Done>
  bool spin(Done&& done) {
    const WaitPolicy policy = wait_policy();
    if (policy == WaitPolicy::Passive) return done();
    const auto start = std::chrono::steady_clock::now();
    for (uint32_t i = 1;; ++i) {
      if (done()) return true;
      cpu_pause();
      if (i % 64 == 0 && policy != WaitPolicy::Active) {  // active: spin on and keep the core, as libgomp
        const int64_t allowed = hot_.load(std::memory_order_relaxed) ? kHotSpinMicros : kColdSpinMicros;
        if (std::chrono::steady_clock::now() - start > std::chrono::microseconds(allowed)) return done();
        sched_yield();
      }
    }
  }

  void serve(int id) {
    InRegion in_region;
    uint64_t seen = 0, now = 0;
    for (;;) {
      auto changed = [&] { return (now = generation_.load()) != seen; };
      if (!spin(changed)) {
        std::unique_lock<std::mutex> lock(mu_);
        ++sleepers_;
        wake_.wait(lock, changed);
        --sleepers_;
      }
      seen = now;
      if (stop_) return;
      if (id < team_) {
        try {
          work_->call(work_->fn, id, team_);
        } catch (...) {
          std::lock_guard<std::mutex> lock(mu_);
          if (!error_) error_ = std::current_exception();
        }
      }
      if (pending_.fetch_sub(1) == 1 && caller_sleeping_.load()) {
        std::lock_guard<std::mutex> lock(mu_);
        done_.notify_one();
      }
    }
  }

  void stop() {
    stop_ = true;
    generation_.fetch_add(1);
    {
      std::lock_guard<std::mutex> lock(mu_);
      wake_.notify_all();
    }
    for (auto& t : threads_) t.join();
  }

  const int size_;
  std::vector<std::thread> threads_;
  // Sequentially consistent throughout: a thread going to sleep and one waking it each write their
  // flag and then read the other's, so at least one of them sees the other.
  alignas(64) std::atomic<uint64_t> generation_{0};  // bumped to start a region (and to stop)
  alignas(64) std::atomic<int> pending_{0};          // workers yet to finish the current region
  std::atomic<int> sleepers_{0};
  std::atomic<bool> caller_sleeping_{false};
  std::atomic<bool> hot_{false};
  std::atomic<bool> stop_{false};
  const Work* work_ = nullptr;  // the current region's, written before generation_ is bumped
  int team_ = 0;
  std::exception_ptr error_;
  std::mutex mu_;
  std::condition_variable wake_, done_;
};

thread_local std::unique_ptr<Team> t_team;

// In a forked child only the forking thread exists: its team's workers are gone, so the team is
// dropped without joining them (a region there makes a new one).
void drop_team_in_child() { (void)t_team.release(); }

}  // namespace

int max_threads() { return omp_get_max_threads(); }

void run_region(int team, const Work& work) {
  if (team <= 1 || t_in_region) {
    work.call(work.fn, 0, 1);
    return;
  }
  static std::once_flag fork_handler;
  std::call_once(fork_handler, [] { pthread_atfork(nullptr, nullptr, drop_team_in_child); });
  if (!t_team || t_team->size() < team) {
    t_team.reset();
    try {
      t_team = std::make_unique<Team>(team);
    } catch (const std::system_error&) {  // no threads to be had: the work is done all the same
      work.call(work.fn, 0, 1);
      return;
    }
  }
  t_team->run(team, work);
}

HotScope::HotScope() {
  if (t_hot++ == 0 && t_team) t_team->set_hot(true);
}

HotScope::~HotScope() {
  if (--t_hot == 0 && t_team) t_team->set_hot(false);
}

}  // namespace threads
}  // namespace popxl
