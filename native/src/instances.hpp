// The other instances of a multi-instance launch (poprun), reached through MPI.
//
// Each instance is one process running the same program on its own replicas (global replicas
// [offset, offset + local)). Collectives whose groups span instances exchange data with the
// instances holding the other members over point-to-point MPI messages, posted and completed from
// the engine's run loop (GIL released, no Python). The MPI library is the one mpi4py loaded (the
// mpich wheel's libmpi.so.12): it is looked up at run time, when a session first joins other
// instances, so processes that never do are not loading MPI (and its fabric libraries) at all.
//
// No wait blocks forever: a wait for messages stops with an InstanceError when popdist says an
// instance failed (its watcher thread sets that, from poprun's supervisor), when an instance we wait
// for has ended its program, when a peer sends a message of another collective than ours (the
// instances' programs went different ways), or after the launch's collective timeout.
#pragma once

#include <mpi.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

namespace popxl {

// A collective could not complete because of another instance (or of this one's own earlier failure).
struct InstanceError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// The MPI functions the engine calls, found in the libmpi already loaded in the process.
struct MpiApi {
  decltype(&MPI_Initialized) Initialized;
  decltype(&MPI_Comm_rank) Comm_rank;
  decltype(&MPI_Comm_size) Comm_size;
  decltype(&MPI_Comm_get_attr) Comm_get_attr;
  decltype(&MPI_Isend) Isend;
  decltype(&MPI_Irecv) Irecv;
  decltype(&MPI_Test) Test;
  decltype(&MPI_Iprobe) Iprobe;
  decltype(&MPI_Cancel) Cancel;
  decltype(&MPI_Request_free) Request_free;
  decltype(&MPI_Error_string) Error_string;
};
// Loads the table on first use; throws when libmpi is not loaded or MPI is not initialised.
const MpiApi& mpi_api();

// What popdist knows of each instance (pushed from Python by the watcher of poprun's supervisor).
enum class PeerState : int { Running = 0, Finished = 1, Failed = 2 };
void set_peer_state(int instance, PeerState state, const std::string& message);
void reset_peer_states();

// Where this process's replicas sit in the launch. A single instance is offset 0, local == global.
struct InstanceLayout {
  int index = 0, count = 1;          // this instance and how many there are
  int local = 1, global = 1;         // replicas per instance and in all
  int offset() const { return index * local; }
  int instance_of(int global_replica) const { return global_replica / local; }
};

// One session's link to the other instances: an MPI communicator of its own (so no message of
// another session or of mpi4py's traffic can match ours) and the requests of the exchange in progress.
class InstanceLink {
 public:
  InstanceLink(MPI_Comm comm, InstanceLayout layout, double timeout_seconds);
  InstanceLink(const InstanceLink&) = delete;
  InstanceLink& operator=(const InstanceLink&) = delete;
  ~InstanceLink();

  const InstanceLayout layout;
  // Messages of one collective carry its tag (the kernel's index): the same on every instance
  // running the same program, so a message of another collective shows that programs diverged.
  int tag_for(int kernel) const { return kernel % (tag_ub_ + 1); }

  // Post a message; the data must stay valid until the exchange's `finish`. Returns the request's
  // position, for `wait`. Large messages are split (MPI counts are ints); `wait` covers every piece.
  size_t send(int instance, int tag, const void* data, int64_t bytes);
  size_t recv(int instance, int tag, void* data, int64_t bytes);
  // Block until request `at` (a position `send`/`recv` returned) has completed.
  void wait(size_t at);
  // Complete every request of the exchange and start a new one. `what` names the collective in errors.
  void finish();
  // The collective the current exchange belongs to (op type and name), for error messages.
  void begin(const std::string& what);
  // Called now and then while a wait lasts (the engine's signal watch during a run): what it throws
  // (Ctrl-C's KeyboardInterrupt) ends the wait, and the link with it.
  const std::function<void()>* poll = nullptr;

 private:
  struct Pending {
    MPI_Request request;
    int instance;  // peer
    int tag;
    bool is_recv;
    size_t last_piece;  // the request holding the message's last piece (pieces complete in order)
  };
  MPI_Comm comm_;
  double timeout_;
  int tag_ub_ = 32767;
  std::vector<Pending> pending_;
  std::vector<bool> done_;
  std::string what_, reason_;
  bool broken_ = false;  // an exchange was abandoned: requests may still point into freed memory
  size_t post(bool is_recv, int instance, int tag, void* data, int64_t bytes);
  void check(int rc, const char* call);
  bool test(size_t i);
  [[noreturn]] void fail(const std::string& why);
  void abandon();
  std::string waiting_for(size_t at) const;
};

}  // namespace popxl
