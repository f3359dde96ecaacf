#include "engine.hpp"

#include "instances.hpp"
#include "kernels/loops.hpp"
#include "threads.hpp"

#include <chrono>
#include <cstdlib>

namespace popxl {

namespace {
struct DTypeInfo { const char* name; DType d; size_t size; };
const DTypeInfo kDTypes[] = {
    {"bool", DType::Bool, 1}, {"int8", DType::I8, 1},       {"int16", DType::I16, 2},
    {"int32", DType::I32, 4}, {"int64", DType::I64, 8},     {"uint8", DType::U8, 1},
    {"uint16", DType::U16, 2}, {"uint32", DType::U32, 4},   {"uint64", DType::U64, 8},
    {"float16", DType::F16, 2}, {"float32", DType::F32, 4}, {"float64", DType::F64, 8},
    {"float8_143", DType::F8_143, 1}, {"float8_152", DType::F8_152, 1},
    {"complex64", DType::C64, 8}, {"complex128", DType::C128, 16},
};
}  // namespace

DType dtype_from_name(const std::string& name) {
  for (auto& t : kDTypes)
    if (name == t.name) return t.d;
  throw std::invalid_argument("unknown dtype " + name);
}

const char* dtype_name(DType d) {
  for (auto& t : kDTypes)
    if (t.d == d) return t.name;
  return "?";
}

size_t itemsize(DType d) {
  for (auto& t : kDTypes)
    if (t.d == d) return t.size;
  return 0;
}

int64_t AttrValue::i() const {
  if (auto p = std::get_if<int64_t>(&v)) return *p;
  if (auto p = std::get_if<bool>(&v)) return *p;
  if (auto p = std::get_if<double>(&v)) return static_cast<int64_t>(*p);
  throw std::runtime_error("attribute is not an int");
}
double AttrValue::f() const {
  if (auto p = std::get_if<double>(&v)) return *p;
  if (auto p = std::get_if<int64_t>(&v)) return static_cast<double>(*p);
  throw std::runtime_error("attribute is not a number");
}
bool AttrValue::b() const {
  if (auto p = std::get_if<bool>(&v)) return *p;
  return i() != 0;
}
const std::string& AttrValue::s() const {
  if (auto p = std::get_if<std::string>(&v)) return *p;
  throw std::runtime_error("attribute is not a string");
}
const AttrList& AttrValue::list() const {
  if (auto p = std::get_if<AttrList>(&v)) return *p;
  throw std::runtime_error("attribute is not a list");
}
std::vector<int64_t> AttrValue::ints() const {
  std::vector<int64_t> out;
  for (auto& x : list()) out.push_back(x.i());
  return out;
}

std::vector<double> OpInstr::attr_floats(const char* name) const {
  std::vector<double> out;
  for (auto& x : attr(name, "floats").list()) out.push_back(x.f());
  return out;
}

std::vector<std::string> OpInstr::attr_strs(const char* name) const {
  std::vector<std::string> out;
  for (auto& x : attr(name, "strs").list()) out.push_back(x.s());
  return out;
}

namespace {
// The declared types a reading as `as` accepts.
bool readable_as(const std::string& declared, const char* as) {
  const std::string a = as;
  if (a == "int") return declared == "int" || declared == "number" || declared == "remote_buffer";
  if (a == "float") return declared == "float" || declared == "number";
  if (a == "str") return declared == "str" || declared == "dtype";
  return declared == a;
}
std::string declared_names(const AttrDecl& d) {
  std::string s;
  for (auto& [n, t] : d) s += (s.empty() ? "" : ", ") + n;
  return s.empty() ? "none" : s;
}
}  // namespace

const AttrValue& OpInstr::attr(const char* name, const char* as) const {
  static const AttrValue none;
  const std::string where = "op '" + this->name + "' (" + type + "): its native kernel reads attribute '" + name + "'";
  if (!declared)
    throw std::invalid_argument(where + ", but op '" + type + "' declares no attributes (popxl.op.OpDef.attributes)");
  auto d = declared->find(name);
  if (d == declared->end())
    throw std::invalid_argument(where + ", which op '" + type + "' does not declare (declared: " +
                                declared_names(*declared) + ")");
  std::string t = d->second;
  if (!t.empty() && t.back() == '?') t.pop_back();
  if (as && !readable_as(t, as))
    throw std::invalid_argument(where + " as " + as + ", but op '" + type + "' declares it " + d->second);
  auto v = attr_values.find(name);
  return v == attr_values.end() ? none : v->second;
}

bool attr_conforms(const std::string& type, const AttrValue& value) {
  if (!type.empty() && type.back() == '?') return value.is_none() || attr_conforms(type.substr(0, type.size() - 1), value);
  const auto& v = value.v;
  const bool is_int = std::holds_alternative<int64_t>(v), is_num = is_int || std::holds_alternative<double>(v);
  if (type == "int" || type == "remote_buffer") return is_int;
  if (type == "float" || type == "number") return is_num;
  if (type == "bool") return std::holds_alternative<bool>(v);
  if (type == "str" || type == "dtype") return std::holds_alternative<std::string>(v);
  if (type == "ints" || type == "floats" || type == "strs") {
    if (!std::holds_alternative<AttrList>(v)) return false;
    const std::string item = type.substr(0, type.size() - 1);
    for (auto& x : std::get<AttrList>(v))
      if (!attr_conforms(item, x)) return false;
    return true;
  }
  return false;
}

std::map<std::string, KernelFactory>& kernel_registry() {
  static std::map<std::string, KernelFactory> registry;
  return registry;
}

namespace {
template <size_t N>
void copy_elems(uint8_t* d, int64_t ds, const uint8_t* s, int64_t ss, int64_t n) {
  for (int64_t i = 0; i < n; ++i) std::memcpy(d + i * ds, s + i * ss, N);
}

// Copies of more bytes than this are shared out over the engine's threads.
constexpr int64_t kParallelCopyBytes = int64_t(1) << 18;
}  // namespace

Buffer packed_like(const Buffer& b) {
  Buffer p = b;
  p.offset = 0;
  p.contiguous = true;
  int64_t acc = static_cast<int64_t>(itemsize(b.dtype));
  for (size_t i = b.shape.size(); i-- > 0;) {
    p.strides[i] = acc;
    acc *= b.shape[i];
  }
  return p;
}

void copy_buffer(uint8_t* arena_dst, const Buffer& dst, const uint8_t* arena_src, const Buffer& src) {
  if (dst.nelms == 0) return;
  uint8_t* d = arena_dst + dst.offset;
  const uint8_t* s = arena_src + src.offset;
  if (d == s && dst.strides == src.strides) return;
  const int64_t bytes = dst.nbytes();
  if (dst.contiguous && src.contiguous) {
    if (bytes < kParallelCopyBytes || (d < s + bytes && s < d + bytes)) {  // small, or overlapping
      std::memmove(d, s, bytes);
      return;
    }
    const int64_t piece = 1 << 16;
    threads::for_each((bytes + piece - 1) / piece, [&](int64_t i) {
      std::memcpy(d + i * piece, s + i * piece, std::min(piece, bytes - i * piece));
    });
    return;
  }
  if (dst.shape.empty()) {
    std::memmove(d, s, itemsize(dst.dtype));
    return;
  }
  // Strided: rows of the merged innermost dimension, on the threads when the copy is big.
  const size_t item = itemsize(dst.dtype);
  nd_loop<2>(dst.shape, {dst.strides, src.strides}, {d, const_cast<uint8_t*>(s)},
             [item](const std::array<uint8_t*, 2>& p, const std::array<int64_t, 2>& st, int64_t n) {
               if (st[0] == static_cast<int64_t>(item) && st[1] == static_cast<int64_t>(item)) {
                 std::memcpy(p[0], p[1], n * item);
                 return;
               }
               switch (item) {
                 case 1: copy_elems<1>(p[0], st[0], p[1], st[1], n); break;
                 case 2: copy_elems<2>(p[0], st[0], p[1], st[1], n); break;
                 case 4: copy_elems<4>(p[0], st[0], p[1], st[1], n); break;
                 case 8: copy_elems<8>(p[0], st[0], p[1], st[1], n); break;
                 default:
                   for (int64_t i = 0; i < n; ++i) std::memcpy(p[0] + i * st[0], p[1] + i * st[1], item);
               }
             }, bytes >= kParallelCopyBytes);
}

Engine::Engine() : layout_(std::make_unique<InstanceLayout>()) {}
Engine::~Engine() = default;

void Engine::not_running(const char* what) const {
  if (running_)
    throw std::runtime_error(std::string("engine: ") + what + " while a run is in progress (from inside the run: a "
                             "kernel, callback or signal handler)");
}

void Engine::set_layout(const InstanceLayout& layout) {
  not_running("set_layout");
  if (layout.local != replicas)
    throw std::invalid_argument("the launch gives each instance " + std::to_string(layout.local) +
                                " replicas, but the executable has " + std::to_string(replicas));
  *layout_ = layout;
  link_.reset();
  bind_instances();
}

void Engine::join(std::unique_ptr<InstanceLink> link) {
  not_running("join");
  link_ = std::move(link);
  bind_instances();
}

void Engine::leave() {
  not_running("leave");
  link_.reset();
  bind_instances();
}

void Engine::bind_instances() {
  for (size_t k = 0; k < kernels.size(); ++k) kernels[k]->bind_instances(*layout_, link_.get(), static_cast<int>(k));
}

void Engine::attach() {
  not_running("attach");
  arenas_.clear();
  arena_ptrs_.clear();
  const size_t bytes = static_cast<size_t>((arena_bytes + 63) / 64 * 64 + 64);
  for (int r = 0; r < replicas; ++r) {
    auto* p = static_cast<uint8_t*>(std::aligned_alloc(64, bytes));
    if (!p) throw std::runtime_error("could not allocate the device arena");
    std::memset(p, 0, bytes);
    arenas_.emplace_back(p);
    arena_ptrs_.push_back(p);
    for (auto& [buf, data] : constants) std::memcpy(p + buffers[buf].offset, data.data(), data.size());
  }
  if (scratch_bytes > 0) {
    scratch_.reset(static_cast<uint8_t*>(std::aligned_alloc(ScratchLayout::kAlign, ScratchLayout::aligned(scratch_bytes))));
    if (!scratch_) {
      detach();
      throw std::runtime_error("could not allocate the kernels' scratch memory");
    }
  }
  for (auto& k : kernels) k->bind_scratch(scratch_.get());
  variables_written();  // new arenas: nothing derived from their contents is current
}

void Engine::detach() {
  not_running("detach");
  leave();
  for (auto& k : kernels) k->bind_scratch(nullptr);
  scratch_.reset();
  arenas_.clear();
  arena_ptrs_.clear();
}

void Engine::run(const std::vector<Host>& inputs, const std::vector<Host>& outputs,
                 const std::function<void()>* poll) {
  if (!attached()) throw std::runtime_error("engine is not attached");
  not_running("run");
  struct Running {  // set for the whole run, however it ends
    std::atomic<bool>& flag;
    explicit Running(std::atomic<bool>& f) : flag(f) { flag = true; }
    ~Running() { flag = false; }
  } running(running_);
  threads::HotScope hot;  // the team's idle threads wait busily for the run's next region
  if (layout_->count > 1 && !link_)
    throw std::runtime_error("engine of instance " + std::to_string(layout_->index) + " of " +
                             std::to_string(layout_->count) + " has not joined the other instances");
  struct PollScope {  // the link polls too while it waits for other instances, for this run only
    InstanceLink* link;
    PollScope(InstanceLink* l, const std::function<void()>* poll) : link(l) { if (link) link->poll = poll; }
    ~PollScope() { if (link) link->poll = nullptr; }
  } poll_scope(link_.get(), poll);
  in_ = inputs;
  out_ = outputs;
  poll_ = poll;
  steps_ = 0;
  loads_.assign(h2d.size() * replicas, 0);
  stores_.assign(d2h.size() * replicas, 0);
  std::vector<int> reps(replicas);
  for (int r = 0; r < replicas; ++r) reps[r] = r;
  if (static_graph >= 0 && static_epoch_ != weights_epoch_) {
    exec(static_graph, reps);
    static_epoch_ = weights_epoch_;  // only once it has run to the end
  }
  exec(0, reps);
  poll_ = nullptr;
}

void Engine::set_profiling(bool on) {
  profiling_ = on;
  reset_profile();
}

void Engine::reset_profile() {
  op_seconds.assign(kernels.size() * replicas, 0.0);
  op_calls.assign(kernels.size() * replicas, 0);
}

void Engine::timed_op(int k, const std::vector<int>& reps) {
  Kernel& kernel = *kernels[k];
  auto timed = [&](const std::vector<int>& group) {
    const auto start = std::chrono::steady_clock::now();
    kernel.run_all(arena_ptrs_, group);
    const double share = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() /
                         static_cast<double>(group.size());
    for (int r : group) {
      op_seconds[k * replicas + r] += share;
      op_calls[k * replicas + r] += 1;
    }
  };
  if (kernel.spans_replicas() || reps.size() == 1) {
    timed(reps);
    return;
  }
  for (int r : reps) timed({r});
}

void Engine::copies(const std::vector<CopyPair>& pairs, const std::vector<int>& reps) {
  for (int r : reps)
    for (auto& c : pairs)
      if (c.src != c.dst) copy_buffer(arena_ptrs_[r], buffers[c.dst], arena_ptrs_[r], buffers[c.src]);
}

void Engine::transfer(const Node& n, const std::vector<int>& reps, bool load) {
  auto& hosts = load ? in_ : out_;
  auto& counts = load ? loads_ : stores_;
  const auto& info = (load ? h2d : d2h)[n.stream];
  const Host& host = hosts[n.stream];
  const Buffer& b = buffers[n.buffer];
  const Buffer packed = packed_like(b);  // the host slice is contiguous
  for (int r : reps) {
    // PopART's StepIO: each transfer takes the next slice, and after the last one the first again.
    int64_t& k = counts[n.stream * replicas + r];
    uint8_t* slice = host.data + ((k % host.transfers) * replicas + r) * info.slice_bytes;
    if (load)
      copy_buffer(arena_ptrs_[r], b, slice, packed);
    else
      copy_buffer(slice, packed, arena_ptrs_[r], b);
    ++k;
  }
}

void Engine::exec(int graph, const std::vector<int>& reps) {
  for (const Node& n : graphs[graph]) {
    step();
    switch (n.kind) {
      case Node::Op:
        if (profiling_)
          timed_op(n.kernel, reps);
        else
          kernels[n.kernel]->run_all(arena_ptrs_, reps);
        break;
      case Node::Copy:
        for (int r : reps) copy_buffer(arena_ptrs_[r], buffers[n.dst], arena_ptrs_[r], buffers[n.src]);
        break;
      case Node::Call:
        copies(n.copy_in, reps);
        exec(n.graph, reps);
        copies(n.copy_out, reps);
        break;
      case Node::Repeat: {
        copies(n.copy_in, reps);
        std::vector<std::vector<uint8_t>> tmp(n.carry.size());
        for (int64_t it = 0; it < n.count; ++it) {
          step();
          exec(n.graph, reps);
          for (int r : reps) {  // parallel assignment: read all carried values first
            uint8_t* a = arena_ptrs_[r];
            bool direct = true;
            for (auto& c : n.carry)
              for (auto& o : n.carry)
                if (&c != &o && c.dst == o.src) direct = false;
            if (direct) {
              for (auto& c : n.carry)
                if (c.src != c.dst) copy_buffer(a, buffers[c.dst], a, buffers[c.src]);
              continue;
            }
            for (size_t i = 0; i < n.carry.size(); ++i) {
              const Buffer& s = buffers[n.carry[i].src];
              tmp[i].resize(s.nbytes());
              copy_buffer(tmp[i].data(), packed_like(s), a, s);
            }
            for (size_t i = 0; i < n.carry.size(); ++i) {
              const Buffer& d = buffers[n.carry[i].dst];
              copy_buffer(a, d, tmp[i].data(), packed_like(d));
            }
          }
        }
        copies(n.copy_out, reps);
        break;
      }
      case Node::If: {
        std::vector<int> yes, no;
        const Buffer& c = buffers[n.cond];
        for (int r : reps) {
          const uint8_t* p = arena_ptrs_[r] + c.offset;
          bool any = false;
          for (size_t i = 0; i < itemsize(c.dtype); ++i) any |= p[i] != 0;
          (any ? yes : no).push_back(r);
        }
        if (!yes.empty()) { copies(n.copy_in, yes); exec(n.graph, yes); copies(n.copy_out, yes); }
        if (!no.empty()) { copies(n.else_in, no); exec(n.else_graph, no); copies(n.else_out, no); }
        break;
      }
      case Node::HostLoad: transfer(n, reps, true); break;
      case Node::HostStore: transfer(n, reps, false); break;
    }
  }
}

}  // namespace popxl
