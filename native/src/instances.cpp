#include "instances.hpp"

#include <dlfcn.h>
#include <sched.h>
#include <time.h>

#include <algorithm>
#include <atomic>
#include <mutex>

namespace popxl {

namespace {

// MPICH's library name: the ABI our mpi.h (from the mpich wheel) describes. mpi4py loaded it first.
constexpr const char* kLibMpi = "libmpi.so.12";

template <class F>
void resolve(void* lib, F& fn, const char* name) {
  fn = reinterpret_cast<F>(dlsym(lib, name));
  if (!fn) throw std::runtime_error(std::string("popdist: ") + kLibMpi + " has no " + name);
}

MpiApi load_api() {
  // RTLD_NOLOAD: the copy mpi4py loaded (and initialised) is the one to use, never a second one.
  void* lib = dlopen(kLibMpi, RTLD_NOW | RTLD_NOLOAD);
  if (!lib)
    throw std::runtime_error(std::string("popdist: MPI is not loaded in this process (") + kLibMpi +
                             " of the mpich wheel); popdist starts it through mpi4py before a session joins "
                             "other instances. Is mpi4py using another MPI library?");
  MpiApi api{};
  resolve(lib, api.Initialized, "MPI_Initialized");
  resolve(lib, api.Comm_rank, "MPI_Comm_rank");
  resolve(lib, api.Comm_size, "MPI_Comm_size");
  resolve(lib, api.Comm_get_attr, "MPI_Comm_get_attr");
  resolve(lib, api.Isend, "MPI_Isend");
  resolve(lib, api.Irecv, "MPI_Irecv");
  resolve(lib, api.Test, "MPI_Test");
  resolve(lib, api.Iprobe, "MPI_Iprobe");
  resolve(lib, api.Cancel, "MPI_Cancel");
  resolve(lib, api.Request_free, "MPI_Request_free");
  resolve(lib, api.Error_string, "MPI_Error_string");
  int initialized = 0;
  api.Initialized(&initialized);
  if (!initialized) throw std::runtime_error("popdist: MPI is loaded but not initialised (popdist.init() starts it).");
  return api;
}

struct PeerTable {
  std::mutex mutex;
  std::vector<std::pair<PeerState, std::string>> states;
  std::atomic<uint64_t> generation{0};
};

PeerTable& peers() {
  static PeerTable table;
  return table;
}

// Messages are split into pieces of at most this many bytes (MPI counts are ints).
constexpr int64_t kMaxPiece = int64_t(1) << 30;

// How long a wait spins on MPI_Test before it yields the core, and then before it sleeps between
// tests: instances may share cores (several per host, other work), and a busy wait would take the
// core the instance it waits for needs.
constexpr uint32_t kSpinTests = 256, kYieldTests = 2048;
constexpr long kSleepNanos = 50'000;
// A peer's message of another collective is a divergence only if it is still there after this long:
// a matched message can show up as the peer's next one for a moment, until our test completes it.
constexpr auto kDivergenceCheck = std::chrono::milliseconds(250);
// A peer that ended its program may still have a message for us on its way (a completed send only
// means MPI holds the data), so its end counts against a wait only if that wait lasts this long after.
constexpr auto kFinishedGrace = std::chrono::seconds(2);

}  // namespace

const MpiApi& mpi_api() {
  static const MpiApi api = load_api();  // a throwing initialiser is retried at the next call
  return api;
}

void set_peer_state(int instance, PeerState state, const std::string& message) {
  PeerTable& t = peers();
  std::lock_guard<std::mutex> lock(t.mutex);
  if (instance < 0) throw std::invalid_argument("instance index must be >= 0");
  if (static_cast<size_t>(instance) >= t.states.size()) t.states.resize(instance + 1, {PeerState::Running, ""});
  t.states[instance] = {state, message};
  t.generation.fetch_add(1, std::memory_order_release);
}

void reset_peer_states() {
  PeerTable& t = peers();
  std::lock_guard<std::mutex> lock(t.mutex);
  t.states.clear();
  t.generation.fetch_add(1, std::memory_order_release);
}

InstanceLink::InstanceLink(MPI_Comm comm, InstanceLayout layout_, double timeout_seconds)
    : layout(layout_), comm_(comm), timeout_(timeout_seconds) {
  const MpiApi& mpi = mpi_api();
  int rank = -1, size = 0;
  check(mpi.Comm_rank(comm_, &rank), "MPI_Comm_rank");
  check(mpi.Comm_size(comm_, &size), "MPI_Comm_size");
  if (rank != layout.index || size != layout.count)
    throw std::runtime_error("popdist: the session's communicator has rank " + std::to_string(rank) + " of " +
                             std::to_string(size) + ", but the launch says instance " + std::to_string(layout.index) +
                             " of " + std::to_string(layout.count));
  int* ub = nullptr;
  int flag = 0;
  if (mpi.Comm_get_attr(comm_, MPI_TAG_UB, &ub, &flag) == MPI_SUCCESS && flag && ub) tag_ub_ = *ub;
}

InstanceLink::~InstanceLink() {
  if (!pending_.empty()) abandon();
}

void InstanceLink::check(int rc, const char* call) {
  if (rc == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING] = {0};
  int len = 0;
  mpi_api().Error_string(rc, text, &len);
  fail(std::string(call) + " failed: " + std::string(text, static_cast<size_t>(std::max(len, 0))));
}

void InstanceLink::begin(const std::string& what) {
  if (broken_)
    throw InstanceError("popdist: " + what + " cannot run: an earlier collective of this session failed, so the "
                        "instances are no longer in step (" + reason_ + ").");
  what_ = what;
}

size_t InstanceLink::post(bool is_recv, int instance, int tag, void* data, int64_t bytes) {
  const MpiApi& mpi = mpi_api();
  const size_t first = pending_.size();
  int64_t at = 0;
  do {  // at least one message, even of 0 bytes
    const int piece = static_cast<int>(std::min(kMaxPiece, bytes - at));
    Pending p{MPI_REQUEST_NULL, instance, tag, is_recv, 0};
    uint8_t* ptr = static_cast<uint8_t*>(data) + at;
    check(is_recv ? mpi.Irecv(ptr, piece, MPI_BYTE, instance, tag, comm_, &p.request)
                  : mpi.Isend(ptr, piece, MPI_BYTE, instance, tag, comm_, &p.request),
          is_recv ? "MPI_Irecv" : "MPI_Isend");
    pending_.push_back(p);
    done_.push_back(false);
    at += piece;
  } while (at < bytes);
  for (size_t i = first; i < pending_.size(); ++i) pending_[i].last_piece = pending_.size() - 1;
  return pending_.size() - 1;
}

size_t InstanceLink::send(int instance, int tag, const void* data, int64_t bytes) {
  return post(false, instance, tag, const_cast<void*>(data), bytes);
}

size_t InstanceLink::recv(int instance, int tag, void* data, int64_t bytes) {
  return post(true, instance, tag, data, bytes);
}

bool InstanceLink::test(size_t i) {
  if (done_[i]) return true;
  int flag = 0;
  check(mpi_api().Test(&pending_[i].request, &flag, MPI_STATUS_IGNORE), "MPI_Test");
  if (flag) done_[i] = true;
  return flag != 0;
}

std::string InstanceLink::waiting_for(size_t at) const {
  return "instance " + std::to_string(pending_[at].instance);
}

void InstanceLink::wait(size_t at) {
  size_t first = at;
  while (first > 0 && pending_[first - 1].last_piece == pending_[at].last_piece) --first;
  const auto start = std::chrono::steady_clock::now();
  auto next_probe = start + kDivergenceCheck;
  int suspect_tag = -1;  // the other collective's tag a peer's message showed at the last probe
  uint64_t generation = ~uint64_t(0);
  bool peer_finished = false;  // the supervisor said `peer` ended its program, at `finished_at`
  std::chrono::steady_clock::time_point finished_at;
  uint32_t tests = 0;
  const int peer = pending_[at].instance;
  for (size_t i = first; i <= at; ++i) {
    while (!test(i)) {
      ++tests;
      if (tests < kSpinTests) continue;
      if (tests < kYieldTests) {
        sched_yield();
        continue;
      }
      const timespec pause{0, kSleepNanos};
      nanosleep(&pause, nullptr);
      if (tests % 16) continue;
      // Every ~1 ms: signals, the peers' states, divergence, the timeout.
      if (poll) {
        try {
          (*poll)();
        } catch (...) {
          abandon();
          reason_ = "interrupted while waiting in " + what_;
          throw;
        }
      }
      PeerTable& table = peers();
      if (const uint64_t g = table.generation.load(std::memory_order_acquire); g != generation) {
        generation = g;
        std::lock_guard<std::mutex> lock(table.mutex);
        for (size_t k = 0; k < table.states.size(); ++k) {
          const auto& [state, message] = table.states[k];
          if (state == PeerState::Failed)
            fail("instance " + std::to_string(k) + " of " + std::to_string(layout.count) + " failed: " + message);
          if (state == PeerState::Finished && static_cast<int>(k) == peer && !peer_finished) {
            peer_finished = true;
            finished_at = std::chrono::steady_clock::now();
          }
        }
      }
      const auto now = std::chrono::steady_clock::now();
      if (peer_finished && now - finished_at > kFinishedGrace)
        fail("instance " + std::to_string(peer) + " ended its program while this instance (" +
             std::to_string(layout.index) + ") waits for it: the instances ran different programs or "
             "different numbers of steps");
      if (now >= next_probe && pending_[i].is_recv) {
        next_probe = now + kDivergenceCheck;
        int flag = 0;
        MPI_Status status;
        check(mpi_api().Iprobe(peer, MPI_ANY_TAG, comm_, &flag, &status), "MPI_Iprobe");
        const int other = flag && status.MPI_TAG != pending_[i].tag ? status.MPI_TAG : -1;
        if (other >= 0 && other == suspect_tag)
          fail("instance " + std::to_string(peer) + " sent a message of another collective (tag " +
               std::to_string(other) + ") while this instance (" + std::to_string(layout.index) +
               ") waits for its part of this one (tag " + std::to_string(pending_[i].tag) +
               "): the instances' programs took different paths (a conditional or a loop count that "
               "differs between instances?)");
        suspect_tag = other;
      }
      const double waited = std::chrono::duration<double>(now - start).count();
      if (timeout_ > 0 && waited > timeout_)
        fail("no message from " + waiting_for(i) + " for " + std::to_string(static_cast<int>(waited)) +
             " s (the collective timeout, POPDIST_TIMEOUT / poprun --timeout): it is stuck, or it does not "
             "run this collective");
    }
  }
}

void InstanceLink::finish() {
  for (size_t i = 0; i < pending_.size(); ++i)
    if (!done_[i]) wait(pending_[i].last_piece);
  pending_.clear();
  done_.clear();
}

void InstanceLink::abandon() {
  // Receives not yet matched are cancelled, so MPI writes nothing more into our buffers; the rest are
  // released. The link is unusable from now on (the instances are out of step).
  broken_ = true;
  const MpiApi& mpi = mpi_api();
  for (size_t i = 0; i < pending_.size(); ++i) {
    if (done_[i]) continue;
    if (pending_[i].is_recv) {
      mpi.Cancel(&pending_[i].request);
      int flag = 0;
      for (int k = 0; k < 1000 && !flag; ++k) {  // a cancelled receive completes at once; bounded anyway
        mpi.Test(&pending_[i].request, &flag, MPI_STATUS_IGNORE);
        if (!flag) sched_yield();
      }
      if (flag) continue;
    }
    if (pending_[i].request != MPI_REQUEST_NULL) mpi.Request_free(&pending_[i].request);
  }
  pending_.clear();
  done_.clear();
}

void InstanceLink::fail(const std::string& why) {
  abandon();
  reason_ = why;
  throw InstanceError("popdist: " + why + ". Instance " + std::to_string(layout.index) + " of " +
                      std::to_string(layout.count) + " stops" + (what_.empty() ? "" : " in " + what_) + ".");
}

}  // namespace popxl
