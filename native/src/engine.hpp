// The native engine: runs an Executable (see popxl/compiler/executable.py) on the CPU.
//
// Everything is prepared at load: buffers are fixed places in one arena per replica, kernels
// (and their oneDNN primitives) are created once, the program tree is turned into nodes.
// `run` executes the main program with the GIL released; replicas run in lockstep. The static
// program (values computed from weights alone) runs first when variables changed since it last ran.
#pragma once

#include <atomic>
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <variant>
#include <vector>

namespace popxl {

struct InstanceLayout;
class InstanceLink;

enum class DType : uint8_t { Bool, I8, I16, I32, I64, U8, U16, U32, U64, F16, F32, F64, F8_143, F8_152, C64, C128 };

DType dtype_from_name(const std::string& name);
const char* dtype_name(DType d);
size_t itemsize(DType d);

// A strided view into the arena: offset and strides in bytes.
struct Buffer {
  int64_t offset = 0;
  std::vector<int64_t> shape;
  std::vector<int64_t> strides;
  DType dtype = DType::F32;
  int64_t nelms = 1;
  bool contiguous = true;
  int64_t nbytes() const { return nelms * static_cast<int64_t>(itemsize(dtype)); }
};

// Attribute values, decoded from the executable's JSON values.
struct AttrValue;
using AttrList = std::vector<AttrValue>;
struct AttrValue {
  std::variant<std::monostate, bool, int64_t, double, std::string, AttrList> v;
  bool is_none() const { return std::holds_alternative<std::monostate>(v); }
  int64_t i() const;
  double f() const;
  bool b() const;
  const std::string& s() const;
  const AttrList& list() const;
  std::vector<int64_t> ints() const;
};
using Attrs = std::map<std::string, AttrValue>;

// An op's attributes as its definition declares them (popxl.op.OpDef.attributes, carried by the
// executable's op_attrs): name -> type, one of popxl.op.ATTRIBUTE_TYPES ("int", "float", "number",
// "bool", "str", "ints", "floats", "strs", "dtype", "remote_buffer"), with "?" at the end when
// the value may be None or absent.
using AttrDecl = std::map<std::string, std::string>;

// Whether `value` is of declared type `type` (the loader's check of every op instruction).
bool attr_conforms(const std::string& type, const AttrValue& value);

struct OpInstr {
  std::string type, name;
  std::vector<int> inputs, outputs;
  // The attribute values; the loader has checked them against `declared`. Kernels read them only
  // through the accessors below, which refuse (std::invalid_argument, naming op and attribute) a
  // name the op does not declare or a reading the declared type does not allow. Kernels are made
  // at load, so a kernel and an op definition that disagree fail at load.
  Attrs attr_values;
  const AttrDecl* declared = nullptr;  // null: the op declares no attributes
  int64_t attr_int(const char* name) const { return attr(name, "int").i(); }         // int, number, remote_buffer
  double attr_float(const char* name) const { return attr(name, "float").f(); }      // float, number
  bool attr_bool(const char* name) const { return attr(name, "bool").b(); }
  const std::string& attr_str(const char* name) const { return attr(name, "str").s(); }  // str, dtype
  std::vector<int64_t> attr_ints(const char* name) const { return attr(name, "ints").ints(); }
  std::vector<double> attr_floats(const char* name) const;
  std::vector<std::string> attr_strs(const char* name) const;
  // A declared attribute of any type, as it is (e.g. an int or None).
  const AttrValue& attr_value(const char* name) const { return attr(name, nullptr); }
  // Whether a declared attribute is None or absent (declared with "?").
  bool attr_is_none(const char* name) const { return attr(name, nullptr).is_none(); }
  // Whether the op declares `name` at all (kernels shared by ops with different attributes).
  bool declares(const char* name) const { return declared && declared->count(name); }
  // The value of declared attribute `name`, read as `as` (null: any type); a None value when absent.
  const AttrValue& attr(const char* name, const char* as) const;
  // Positions of inputs lying in static storage: their bytes change only when the engine's
  // weights epoch does (see Engine::variables_written).
  std::vector<int> static_inputs;
  bool is_static_input(int position) const {
    return std::find(static_inputs.begin(), static_inputs.end(), position) != static_inputs.end();
  }
};

// The scratch memory one kernel needs only while it runs: oneDNN scratchpads, operands reordered
// into a primitive's layout, float32 staging of float16 operands. Kernels run one at a time
// (replicas in turn, ops in program order), so the engine backs every kernel's layout with the
// same 64-byte-aligned region, sized at load to the largest; a kernel lays out its pieces here.
class ScratchLayout {
 public:
  static constexpr size_t kAlign = 64;  // cache line, AVX-512 vector
  static size_t aligned(size_t bytes) { return (bytes + kAlign - 1) / kAlign * kAlign; }
  // A piece of `bytes` of its own, live for the whole run; returns its offset.
  size_t reserve(size_t bytes) {
    const size_t at = own_;
    own_ += aligned(bytes);
    return at;
  }
  // Room for a oneDNN scratchpad: the primitives of one kernel run one after another, so their
  // scratchpads share one piece, after the kernel's own pieces.
  void reserve_scratchpad(size_t bytes) { pad_ = std::max(pad_, aligned(bytes)); }
  size_t bytes() const { return own_ + pad_; }
  void bind(uint8_t* region) { region_ = region; }
  uint8_t* at(size_t offset) const { return region_ + offset; }
  uint8_t* scratchpad() const { return region_ + own_; }

 private:
  uint8_t* region_ = nullptr;
  size_t own_ = 0, pad_ = 0;
};

// A kernel prepared at load for one op instruction.
class Kernel {
 public:
  virtual ~Kernel() = default;
  virtual void run(uint8_t* arena) = 0;
  // The engine's shared scratch region: how much of it this kernel uses, and where it is (bound
  // at attach, before any run). A kernel made of kernels run in turn overrides both.
  virtual size_t scratch_bytes() const { return scratch.bytes(); }
  virtual void bind_scratch(uint8_t* region) { scratch.bind(region); }
  ScratchLayout scratch;
  // Collective kernels override this to see every replica at once.
  virtual void run_all(const std::vector<uint8_t*>& arenas, const std::vector<int>& replicas) {
    for (int r : replicas) run(arenas[r]);
  }
  // True when one call serves all replicas together (collectives, Python fallbacks): profiling then
  // shares the call's time out evenly instead of timing each replica on its own.
  virtual bool spans_replicas() const { return false; }
  // How the kernel computes, where it chooses among ways (e.g. a convolution's algorithm), for
  // tests and profiles; empty otherwise.
  virtual std::string algorithm() const { return {}; }
  // The engine's weights epoch, bound at load (null for a kernel run outside an engine): while it
  // is unchanged, static inputs (OpInstr::static_inputs) hold the same bytes in each arena. A
  // kernel made of kernels passes it on.
  virtual void bind_weights_epoch(const uint64_t* epoch) { weights_epoch = epoch; }
  const uint64_t* weights_epoch = nullptr;
  // Collectives: where this instance's replicas sit among all instances' (`layout`), the link to the
  // other instances (null when there are none) and the kernel's place in the program (`index`, the
  // same on every instance, which tags its messages). Bound at load and again when the engine joins
  // or leaves other instances.
  virtual void bind_instances(const InstanceLayout& layout, InstanceLink* link, int index) {}
};

using KernelFactory = std::function<std::unique_ptr<Kernel>(const OpInstr&, const std::vector<Buffer>&)>;
std::map<std::string, KernelFactory>& kernel_registry();

struct RegisterKernel {
  RegisterKernel(std::initializer_list<const char*> names, KernelFactory f) {
    for (auto n : names) kernel_registry()[n] = f;
  }
};

// The same shape and dtype, C-contiguous at offset 0.
Buffer packed_like(const Buffer& b);

// Copy a strided view into another of the same shape and dtype.
void copy_buffer(uint8_t* arena_dst, const Buffer& dst, const uint8_t* arena_src, const Buffer& src);

struct CopyPair { int src, dst; };

struct Node {
  enum Kind { Op, Copy, Call, Repeat, If, HostLoad, HostStore } kind = Op;
  int kernel = -1;
  int src = -1, dst = -1;
  int graph = -1, else_graph = -1;
  int64_t count = 0;
  int cond = -1;
  int stream = -1, buffer = -1;
  std::vector<CopyPair> copy_in, copy_out, carry, else_in, else_out;
};

struct StreamInfo {
  std::string name;
  int64_t slice_bytes = 0;
};

class Engine {
 public:
  Engine();
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;
  std::vector<Buffer> buffers;
  std::vector<std::vector<Node>> graphs;
  std::vector<std::unique_ptr<Kernel>> kernels;
  std::vector<OpInstr> op_instrs;  // per kernel index, for fallbacks and error messages
  std::map<std::string, AttrDecl> op_attrs;  // the executable's attribute declarations, by op type
  std::vector<std::pair<int, std::string>> constants;
  std::vector<StreamInfo> h2d, d2h;
  int64_t arena_bytes = 0;
  int replicas = 1;
  int64_t transfers = 1;  // the executable's num_host_transfers: host buffers hold this many steps
  int static_graph = -1;  // index into `graphs` of the static program, or -1
  // The largest scratch any kernel needs; one region of it is allocated at attach (not per
  // replica: replicas run in turn on this thread, so no two kernels ever use it at once).
  size_t scratch_bytes = 0;

  void attach();
  void detach();
  // A launch of several instances (processes, poprun): this one's place, set at load (replica
  // groupings count all instances' replicas), and its link to the others, joined before a run and
  // left at detach. Collectives whose groups span instances exchange data through the link.
  void set_layout(const InstanceLayout& layout);
  const InstanceLayout& layout() const { return *layout_; }
  void join(std::unique_ptr<InstanceLink> link);
  void leave();
  InstanceLink* link() const { return link_.get(); }
  bool attached() const { return !arenas_.empty(); }
  // Every write of device variables from outside a run must be followed by this (attach counts
  // as one): it moves the weights epoch on, so the static program runs again before the next
  // run and kernels drop what they derived from static storage.
  void variables_written() { ++weights_epoch_; }
  const uint64_t* weights_epoch() const { return &weights_epoch_; }
  uint8_t* arena(int r) { return arenas_.at(r).get(); }

  // Host buffers: contiguous (num_host_transfers, replicas, *shape) arrays.
  struct Host { uint8_t* data; int64_t transfers; };
  // Runs the main program (after the static one, if stale). `poll`, if given, is called on this
  // thread every kPollSteps program steps (ops, copies, transfers, loop iterations): the bindings
  // watch for signals (Ctrl-C) there, and an exception it throws stops the run between two steps,
  // leaving every buffer as the last completed step left it. Each host_load / host_store moves
  // the stream's next slice, wrapping to slice 0 after the last (as PopART's StepIO), so a stream
  // may be transferred any number of times; the counts of the last run are kept.
  void run(const std::vector<Host>& inputs, const std::vector<Host>& outputs,
           const std::function<void()>* poll = nullptr);
  // How many times each stream was transferred on each replica in the last run, indexed
  // [stream * replicas + replica].
  const std::vector<int64_t>& load_counts() const { return loads_; }
  const std::vector<int64_t>& store_counts() const { return stores_; }
  static constexpr uint32_t kPollSteps = 64;

  // Per-op profiling (off by default: it costs two clock reads per op): seconds and calls of each
  // kernel on each replica since the last reset, indexed [kernel * replicas + replica].
  void set_profiling(bool on);
  bool profiling() const { return profiling_; }
  void reset_profile();
  std::vector<double> op_seconds;
  std::vector<int64_t> op_calls;

 private:
  struct Free { void operator()(uint8_t* p) const { std::free(p); } };
  std::vector<std::unique_ptr<uint8_t, Free>> arenas_;
  std::unique_ptr<uint8_t, Free> scratch_;
  std::vector<uint8_t*> arena_ptrs_;
  std::vector<Host> in_, out_;
  std::vector<int64_t> loads_, stores_;
  void exec(int graph, const std::vector<int>& reps);
  void step() {
    if (++steps_ % kPollSteps == 0 && poll_) (*poll_)();
  }
  const std::function<void()>* poll_ = nullptr;
  uint32_t steps_ = 0;
  void copies(const std::vector<CopyPair>& pairs, const std::vector<int>& reps);
  void transfer(const Node& n, const std::vector<int>& reps, bool load);
  void timed_op(int kernel, const std::vector<int>& reps);
  bool profiling_ = false;
  std::atomic<bool> running_{false};  // inside run(): the arenas and links may not change
  void not_running(const char* what) const;
  std::unique_ptr<InstanceLayout> layout_;
  std::unique_ptr<InstanceLink> link_;
  void bind_instances();
  uint64_t weights_epoch_ = 0;
  uint64_t static_epoch_ = 0;  // the epoch the static program last ran at (0: never, epochs start at 1)
};

}  // namespace popxl
