// Collectives across replicas (replicated_all_reduce(_), replicated_reduce_scatter,
// replicated_all_gather, replica_sharded_slice, replicated_slice) and all_reduce across the IPUs
// of one replica.
//
// The replicas of this process are read from their arenas directly; a group with members in other
// instances (processes of a poprun launch) exchanges data with them through MPI (instances.hpp).
// Reductions follow NumPy's along a stacked member axis: members are combined one after another in
// replica order, the same order however the replicas are spread over instances: each instance
// holds a consecutive run of a group's members, and the instance that reduces a range of elements
// starts from the first instance's running reduction and adds the later members' values in order
// (AllReduce::reduce). float16 sums round at every step, means accumulate in float32 (float64 for
// integers, truncated back); integer sums and products wrap.
#include <cmath>
#include <cstring>
#include <map>

#include "../instances.hpp"
#include "loops.hpp"

namespace popxl {
namespace {

using std::unique_ptr;

enum class RedOp { Add, Mean, Mul, Min, Max, And, Or, SquareAdd };

bool red_op(const std::string& s, RedOp& op) {
  static const std::map<std::string, RedOp> names = {
      {"add", RedOp::Add}, {"mean", RedOp::Mean}, {"mul", RedOp::Mul}, {"min", RedOp::Min},
      {"max", RedOp::Max}, {"and", RedOp::And}, {"or", RedOp::Or}, {"square_add", RedOp::SquareAdd}};
  auto it = names.find(s);
  if (it == names.end()) return false;
  op = it->second;
  return true;
}

// The running state of a reduction, per element: what the members so far reduce to. Means keep
// their sum in MeanState<T>; every other reduction keeps a value of T (NaN once a min or max met
// one; 0 or 1 for and / or). Integer sums and products wrap in T, as in the 64-bit sum cut to T.
template <class T>
using MeanState = std::conditional_t<std::is_integral_v<T>, double, typename Wide<T>::type>;

template <class T>
T wrap(uint64_t v) { return static_cast<T>(v); }
template <class T>
uint64_t bits(T v) { return static_cast<uint64_t>(static_cast<int64_t>(v)); }

// s[e] = the state after member x[e] joins it (`started` false: x is the first member).
template <class T, class S>
void fold(RedOp op, S* s, bool started, const T* x, int64_t n) {
  using W = typename Wide<T>::type;
  if (op == RedOp::Mean) {  // the sum (0 + x first, as NumPy's sum starts from 0)
    for (int64_t e = 0; e < n; ++e) s[e] = (started ? s[e] : S(0)) + S(x[e]);
  } else if constexpr (!std::is_same_v<S, T>) {
    throw std::logic_error("collectives: only a mean keeps a state of another type");
  } else if constexpr (std::is_integral_v<T>) {
    switch (op) {
      case RedOp::Add:
        for (int64_t e = 0; e < n; ++e) s[e] = started ? wrap<T>(bits(s[e]) + bits(x[e])) : x[e];
        break;
      case RedOp::Mul:
        for (int64_t e = 0; e < n; ++e) s[e] = started ? wrap<T>(bits(s[e]) * bits(x[e])) : x[e];
        break;
      case RedOp::SquareAdd:
        for (int64_t e = 0; e < n; ++e) {
          const T sq = wrap<T>(bits(x[e]) * bits(x[e]));
          s[e] = started ? wrap<T>(bits(s[e]) + bits(sq)) : sq;
        }
        break;
      case RedOp::Min:
        for (int64_t e = 0; e < n; ++e) s[e] = !started || x[e] < s[e] ? x[e] : s[e];
        break;
      case RedOp::Max:
        for (int64_t e = 0; e < n; ++e) s[e] = !started || x[e] > s[e] ? x[e] : s[e];
        break;
      case RedOp::And:
        for (int64_t e = 0; e < n; ++e) s[e] = T((!started || s[e] != 0) && x[e] != 0);
        break;
      default:  // Or
        for (int64_t e = 0; e < n; ++e) s[e] = T((started && s[e] != 0) || x[e] != 0);
    }
  } else {
    switch (op) {
      case RedOp::Add:
        for (int64_t e = 0; e < n; ++e) s[e] = started ? T(W(s[e]) + W(x[e])) : x[e];
        break;
      case RedOp::Mul:
        for (int64_t e = 0; e < n; ++e) s[e] = started ? T(W(s[e]) * W(x[e])) : x[e];
        break;
      case RedOp::SquareAdd:
        for (int64_t e = 0; e < n; ++e) {
          const T sq = T(W(x[e]) * W(x[e]));
          s[e] = started ? T(W(s[e]) + W(sq)) : sq;
        }
        break;
      case RedOp::Min: case RedOp::Max: {  // NaN propagates: once met, the state stays NaN
        const bool min = op == RedOp::Min;
        for (int64_t e = 0; e < n; ++e) {
          const W v = W(x[e]), have = W(s[e]);
          if (!started || v != v) s[e] = v != v ? T(NAN) : x[e];
          else if (have == have && (min ? v < have : v > have)) s[e] = x[e];
        }
        break;
      }
      case RedOp::And:
        for (int64_t e = 0; e < n; ++e) s[e] = T((!started || W(s[e]) != 0) && W(x[e]) != 0);
        break;
      default:  // Or
        for (int64_t e = 0; e < n; ++e) s[e] = T((started && W(s[e]) != 0) || W(x[e]) != 0);
    }
  }
}

// out[e] = the reduction's value from its final state over `members` members.
template <class T, class S>
void finish(RedOp op, const S* s, T* out, int64_t n, int64_t members) {
  if (op != RedOp::Mean) {
    // (n == 0: an empty tensor's buffers may be null, which memcpy may not be given)
    if constexpr (std::is_same_v<S, T>) if (n > 0) std::memcpy(out, s, n * sizeof(T));
  } else if constexpr (std::is_integral_v<T>) {
    for (int64_t e = 0; e < n; ++e) out[e] = convert<T>(s[e] / double(members));
  } else {
    for (int64_t e = 0; e < n; ++e) out[e] = T(s[e] / S(members));
  }
}

// Call f(Tag<S>{}) for the state type of reducing T values with `op`.
template <class T, class F>
void with_state(RedOp op, F&& f) {
  if (op == RedOp::Mean) f(Tag<MeanState<T>>{});
  else f(Tag<T>{});
}

// out[e] = reduction over members m of x[m][e] (all packed, n elements), all in this process.
template <class T>
void reduce_members(RedOp op, const std::vector<const T*>& x, T* out, int64_t n) {
  with_state<T>(op, [&](auto state) {
    using S = typename decltype(state)::type;
    std::vector<S> s(static_cast<size_t>(n));
    for (size_t m = 0; m < x.size(); ++m) fold<T, S>(op, s.data(), m > 0, x[m], n);
    finish<T, S>(op, s.data(), out, n, static_cast<int64_t>(x.size()));
  });
}

// One replica group as this instance sees it: its size, this instance's members (local replica
// indices, in member order, starting at member position `first`), and the instances holding
// members, in member order, with the position and count of each one's run of members.
struct GroupView {
  int64_t id = 0;
  int size = 0, first = 0;
  std::vector<int> local;
  std::vector<int> instances, starts, counts;
  int me = 0;  // this instance's place in `instances`
  bool spans_instances() const { return instances.size() > 1; }
};

// Base of replica collectives: the groups of the assignment (global replicas) that have members here.
struct Collective : Kernel {
  std::vector<int64_t> assignment;
  std::string what;  // "op type 'name'", for errors
  InstanceLink* link = nullptr;
  int tag = 0;
  std::vector<GroupView> views;
  void run(uint8_t*) override { throw std::logic_error("collectives run through run_all"); }
  bool spans_replicas() const override { return true; }
  void bind_instances(const InstanceLayout& layout, InstanceLink* l, int index) override {
    link = l;
    tag = l ? l->tag_for(index) : 0;
    views.clear();
    std::map<int64_t, GroupView> by_id;
    std::vector<int> position(assignment.size());
    for (size_t r = 0; r < assignment.size(); ++r) {
      GroupView& g = by_id[assignment[r]];
      g.id = assignment[r];
      position[r] = g.size++;
    }
    for (auto& [id, g] : by_id) {
      for (size_t r = 0; r < assignment.size(); ++r) {
        if (assignment[r] != id) continue;
        const int inst = layout.instance_of(static_cast<int>(r));
        if (g.instances.empty() || g.instances.back() != inst) {
          g.instances.push_back(inst);
          g.starts.push_back(position[r]);
          g.counts.push_back(0);
        }
        ++g.counts.back();
        if (inst == layout.index) {
          if (g.local.empty()) g.first = position[r];
          g.local.push_back(static_cast<int>(r) - layout.offset());
        }
      }
      if (g.local.empty()) continue;  // the other instances reduce it
      g.me = static_cast<int>(std::find(g.instances.begin(), g.instances.end(), layout.index) - g.instances.begin());
      views.push_back(std::move(g));
    }
  }
  void run_all(const std::vector<uint8_t*>& arenas, const std::vector<int>& replicas) override {
    for (const GroupView& g : views) {
      size_t present = 0;
      for (int r : g.local) present += std::find(replicas.begin(), replicas.end(), r) != replicas.end();
      if (present == 0 && replicas.size() < arenas.size()) continue;  // no member here runs it (a branch)
      if (present != g.local.size())
        throw std::runtime_error("a collective ran on only part of its replica group (inside a conditional "
                                 "taken differently by different replicas?)");
      if (g.spans_instances() && !link)
        throw std::logic_error(what + ": a group spans instances, but the engine has no link to them");
      if (g.spans_instances()) link->begin(what);
      group(arenas, g);
      if (g.spans_instances()) link->finish();
    }
  }
  virtual void group(const std::vector<uint8_t*>& arenas, const GroupView& g) = 0;
};

// The flattened, zero-padded chunk j of n of `packed` bytes (size `chunk` elements).
void shard_into(uint8_t* dst, const uint8_t* packed, int64_t total, int64_t chunk, int64_t j, size_t item) {
  const int64_t begin = std::min(total, j * chunk), end = std::min(total, (j + 1) * chunk);
  if (end > begin) std::memcpy(dst, packed + begin * item, (end - begin) * item);  // (empty: pointers may be null)
  if (chunk > end - begin) std::memset(dst + (end - begin) * item, 0, (chunk - (end - begin)) * item);
}

// Bytes of the pieces instances exchange: big enough that messages cost little each, small enough
// that the receiver starts on a value while the rest is still on its way.
constexpr int64_t kChunkBytes = int64_t(1) << 18;

// all-reduce, and reduce-scatter (all-reduce, then each member keeps its shard).
struct AllReduce : Collective {
  Buffer x, y;
  RedOp op;
  bool scatter = false;
  std::vector<std::vector<uint8_t>> staged;
  std::vector<const uint8_t*> inputs;  // each local member's x, packed: in its arena or staged
  std::vector<uint8_t> state, result, shard, incoming;
  uint8_t* out = nullptr;              // where the packed result goes: the first member's y, or `result`
  void group(const std::vector<uint8_t*>& arenas, const GroupView& g) override {
    // The members' x are read in place unless strided or overlapping y (an in-place all-reduce:
    // outputs are written while other instances may still be reading the inputs).
    const bool disjoint = x.offset + x.nbytes() <= y.offset || y.offset + y.nbytes() <= x.offset;
    const bool read_in_arena = x.contiguous && y.contiguous && disjoint;
    const Buffer px = packed_like(x);
    staged.resize(read_in_arena ? 0 : g.local.size());
    inputs.resize(g.local.size());
    for (size_t m = 0; m < g.local.size(); ++m) {
      if (read_in_arena) {
        inputs[m] = arenas[g.local[m]] + x.offset;
        continue;
      }
      staged[m].resize(x.nbytes());
      copy_buffer(staged[m].data(), px, arenas[g.local[m]], x);
      inputs[m] = staged[m].data();
    }
    const bool direct = !scatter && y.contiguous;
    if (!direct) result.resize(x.nbytes());
    out = direct ? arenas[g.local[0]] + y.offset : result.data();
    dispatch_arith(x.dtype, [&](auto tag) {
      using T = typename decltype(tag)::type;
      with_state<T>(op, [&](auto st) { reduce<T, typename decltype(st)::type>(g); });
    });
    const Buffer py = packed_like(y);
    for (size_t m = direct ? 1 : 0; m < g.local.size(); ++m) {
      if (!scatter) {
        copy_buffer(arenas[g.local[m]], y, out, py);
        continue;
      }
      shard.resize(y.nbytes());
      shard_into(shard.data(), out, x.nelms, y.nelms, g.first + static_cast<int64_t>(m), itemsize(x.dtype));
      copy_buffer(arenas[g.local[m]], y, shard.data(), py);
    }
  }

  // result = the group's reduction, through state (S per element).
  template <class T, class S>
  void reduce(const GroupView& g) {
    const int64_t n = x.nelms;
    state.resize(static_cast<size_t>(n) * sizeof(S));
    S* s = reinterpret_cast<S*>(state.data());
    T* r = reinterpret_cast<T*>(out);
    auto local_fold = [&](int64_t from, int64_t len, bool started) {
      for (size_t m = 0; m < inputs.size(); ++m)
        fold<T, S>(op, s + from, started || m > 0, reinterpret_cast<const T*>(inputs[m]) + from, len);
    };
    if (!g.spans_instances()) {
      local_fold(0, n, false);
      finish<T, S>(op, s, r, n, g.size);
      return;
    }
    if (n == 0) return;
    // Across instances, each instance owns a range of the elements (its members' shards for a
    // reduce-scatter, an equal part otherwise) and reduces it from every member's value in member
    // order; the first instance, when it has several members, sends their running state instead.
    // An all-reduce then sends each owner's finished range to every instance. Both exchanges run
    // in every direction at once, in chunks (a chunk is folded and sent on as soon as it is in),
    // and move about 2 (K - 1) / K of the tensor per instance, as a ring would.
    const int K = static_cast<int>(g.instances.size()), p = g.me;
    auto lo = [&](int q) -> int64_t {
      if (q >= K) return n;
      return scatter ? std::min(n, static_cast<int64_t>(g.starts[q]) * y.nelms) : n / K * q + std::min<int64_t>(q, n % K);
    };
    const int64_t C = std::max<int64_t>(1, kChunkBytes / static_cast<int64_t>(std::max(sizeof(S), sizeof(T))));
    auto chunks = [&](int q) { return (lo(q + 1) - lo(q) + C - 1) / C; };
    auto len = [&](int q, int64_t c) { return std::min(C, lo(q + 1) - lo(q) - c * C); };
    const bool first_sends_state = g.counts[0] > 1;
    // Values received for my range: a block of L per member of the other instances.
    const int64_t L = lo(p + 1) - lo(p);
    int64_t blocks = 0;
    for (int k = 0; k < K; ++k) blocks += k == p || (k == 0 && first_sends_state) ? 0 : g.counts[k];
    incoming.resize(static_cast<size_t>(blocks * L) * sizeof(T));
    T* in = reinterpret_cast<T*>(incoming.data());
    // Receives first (a peer's messages match them in the order both sides post them): the others'
    // parts of my range, then their finished ranges.
    std::vector<std::vector<size_t>> parts(static_cast<size_t>(chunks(p)));
    std::vector<size_t> finished;
    for (int64_t c = 0; c < chunks(p); ++c) {
      const int64_t at = lo(p) + c * C;
      for (int k = 0, b = 0; k < K; ++k) {
        if (k == p) continue;
        if (k == 0 && first_sends_state) {
          parts[c].push_back(link->recv(g.instances[0], tag, s + at, len(p, c) * sizeof(S)));
          continue;
        }
        for (int m = 0; m < g.counts[k]; ++m, ++b)
          parts[c].push_back(link->recv(g.instances[k], tag, in + b * L + c * C, len(p, c) * sizeof(T)));
      }
    }
    for (int k = 0; k < K && !scatter; ++k)
      for (int64_t c = 0; c < chunks(k) && k != p; ++c)
        finished.push_back(link->recv(g.instances[k], tag, r + lo(k) + c * C, len(k, c) * sizeof(T)));
    // My parts of the others' ranges.
    const bool send_state = p == 0 && first_sends_state;
    if (send_state) local_fold(0, n, false);
    for (int q = 0; q < K; ++q) {
      for (int64_t c = 0; c < chunks(q) && q != p; ++c) {
        const int64_t at = lo(q) + c * C;
        if (send_state) {
          link->send(g.instances[q], tag, s + at, len(q, c) * sizeof(S));
          continue;
        }
        for (const uint8_t* member : inputs)
          link->send(g.instances[q], tag, reinterpret_cast<const T*>(member) + at, len(q, c) * sizeof(T));
      }
    }
    // My range, chunk by chunk as the parts come in, folded in member order.
    for (int64_t c = 0; c < chunks(p); ++c) {
      const int64_t at = lo(p) + c * C, m = len(p, c);
      for (size_t part : parts[c]) link->wait(part);
      bool started = first_sends_state;  // then s holds the first instance's state (received or mine)
      for (int k = first_sends_state ? 1 : 0, b = 0; k < K; ++k) {
        for (int j = 0; j < g.counts[k]; ++j, started = true) {
          const T* values = k == p ? reinterpret_cast<const T*>(inputs[j]) + at : in + (b++) * L + c * C;
          fold<T, S>(op, s + at, started, values, m);
        }
      }
      finish<T, S>(op, s + at, r + at, m, g.size);
      for (int q = 0; q < K && !scatter; ++q)
        if (q != p) link->send(g.instances[q], tag, r + at, m * sizeof(T));
    }
    for (size_t f : finished) link->wait(f);
  }
};

template <class K>
unique_ptr<K> collective(const OpInstr& ins) {
  auto k = std::make_unique<K>();
  k->assignment = ins.attr_ints("groups");
  k->what = ins.type + " '" + ins.name + "'";
  return k;
}

KernelFactory all_reduce(bool scatter) {
  return [scatter](const OpInstr& ins, const std::vector<Buffer>& bufs) -> unique_ptr<Kernel> {
    auto k = collective<AllReduce>(ins);
    k->x = bufs[ins.inputs[0]];
    k->y = bufs[ins.outputs[0]];
    k->scatter = scatter;
    if (!red_op(ins.attr_str("op"), k->op) || k->x.dtype == DType::Bool ||
        !dispatch_arith(k->x.dtype, [](auto) {}))
      return nullptr;
    return k;
  };
}

// Member j's own piece of its input: the flattened shard, or the j-th equal slice along an axis.
// Nothing crosses instances: j is the member's position in its whole group.
struct OwnPiece : Collective {
  Buffer x, y;
  int64_t axis = -1;  // -1: flattened shard
  std::vector<uint8_t> packed, shard;
  void group(const std::vector<uint8_t*>& arenas, const GroupView& g) override {
    for (size_t i = 0; i < g.local.size(); ++i) {
      uint8_t* a = arenas[g.local[i]];
      const int64_t j = g.first + static_cast<int64_t>(i);
      if (axis >= 0) {
        const int64_t len = y.shape[axis];
        copy_buffer(a, y, a, window(x, static_cast<size_t>(axis), j * len, len));
        continue;
      }
      packed.resize(x.nbytes());
      copy_buffer(packed.data(), packed_like(x), a, x);
      shard.resize(y.nbytes());
      shard_into(shard.data(), packed.data(), x.nelms, y.nelms, j, itemsize(x.dtype));
      copy_buffer(a, y, shard.data(), packed_like(y));
    }
  }
};

KernelFactory own_piece(bool sliced) {
  return [sliced](const OpInstr& ins, const std::vector<Buffer>& bufs) -> unique_ptr<Kernel> {
    auto k = collective<OwnPiece>(ins);
    k->x = bufs[ins.inputs[0]];
    k->y = bufs[ins.outputs[0]];
    if (sliced) k->axis = ins.attr_int("axis");
    return k;
  };
}

// all-gather: stack (new axis), concatenate along an axis, or reassemble the flattened shards.
// Members in other instances send their inputs (each instance its run of members, in one message).
struct AllGather : Collective {
  Buffer x, y;
  std::string mode;
  int64_t axis = 0;
  std::vector<uint8_t> flat;
  void group(const std::vector<uint8_t*>& arenas, const GroupView& g) override {
    const size_t n = static_cast<size_t>(g.size);
    const int64_t xb = x.nbytes();
    auto piece = [&](size_t m) {  // member m's input, packed in `flat`
      Buffer b = packed_like(x);
      b.offset = static_cast<int64_t>(m) * xb;
      return b;
    };
    // Where each member's input is: its arena, or `flat` (other instances' members, and all of them
    // when the output is the flat concatenation).
    std::vector<std::pair<const uint8_t*, Buffer>> source(n, {nullptr, x});
    const bool remote = g.spans_instances();
    if (remote || mode == "meta_shape") {
      flat.resize(n * xb);
      for (size_t i = 0; i < g.local.size(); ++i)
        copy_buffer(flat.data(), piece(g.first + i), arenas[g.local[i]], x);
      for (size_t q = 0; remote && q < g.instances.size(); ++q) {
        if (static_cast<int>(q) == g.me) continue;
        link->recv(g.instances[q], tag, flat.data() + g.starts[q] * xb, g.counts[q] * xb);
        link->send(g.instances[q], tag, flat.data() + g.first * xb, static_cast<int64_t>(g.local.size()) * xb);
      }
      if (remote) link->finish();
      for (size_t m = 0; m < n; ++m) source[m] = {flat.data(), piece(m)};
    }
    for (size_t i = 0; i < g.local.size(); ++i) source[g.first + i] = {arenas[g.local[i]], x};
    if (mode == "meta_shape") {
      for (int r : g.local) copy_buffer(arenas[r], y, flat.data(), packed_like(y));
      return;
    }
    for (int r : g.local)
      for (size_t m = 0; m < n; ++m) {
        // member m's place in the output
        Buffer win = window(y, mode == "new_axis" ? 0 : static_cast<size_t>(axis),
                            static_cast<int64_t>(m) * (mode == "new_axis" ? 1 : x.shape[axis]),
                            mode == "new_axis" ? 1 : x.shape[axis]);
        if (mode == "new_axis") {
          win.shape.erase(win.shape.begin());
          win.strides.erase(win.strides.begin());
          refresh(win);
        }
        copy_buffer(arenas[r], win, source[m].first, source[m].second);
      }
  }
};

const RegisterKernel collective_ops[] = {
    {{"replicated_all_reduce", "replicated_all_reduce_"}, all_reduce(false)},
    {{"replicated_reduce_scatter"}, all_reduce(true)},
    {{"replica_sharded_slice"}, own_piece(false)},
    {{"replicated_slice"}, own_piece(true)},
    {{"replicated_all_gather"}, [](const OpInstr& ins, const std::vector<Buffer>& bufs) -> unique_ptr<Kernel> {
       auto k = collective<AllGather>(ins);
       k->x = bufs[ins.inputs[0]];
       k->y = bufs[ins.outputs[0]];
       k->mode = ins.attr_str("output_shape");
       k->axis = ins.attr_int("axis");
       return k;
     }},
};

// add_n of float operands (seen with the output's shape), summed left to right as the general
// path does, straight from the arena and on all threads: y = x0 + x1, then y += x2, ... The memory
// plan never places an op's output over an input it reads, so y can serve as the accumulator.
unique_ptr<Kernel> add_n_in_place(const std::vector<Buffer>& xs, const Buffer& y) {
  for (const Buffer& x : xs)
    if (x.dtype != y.dtype) return nullptr;
  unique_ptr<Kernel> k;
  dispatch_float(y.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    using W = typename Wide<T>::type;
    k = std::make_unique<FnKernel>([=](uint8_t* a) {
      if (xs.size() == 1) copy_buffer(a, y, a, xs[0]);
      for (size_t i = 1; i < xs.size(); ++i) {
        const Buffer& acc = i == 1 ? xs[0] : y;
        nd_loop<3>(y.shape, {y.strides, acc.strides, xs[i].strides}, {a + y.offset, a + acc.offset, a + xs[i].offset},
                   [](const std::array<uint8_t*, 3>& p, const std::array<int64_t, 3>& s, int64_t n) {
                     combine_rows<T, W>(p, s, n, [](W u, W v) { return u + v; });
                   });
      }
    });
  });
  return k;
}

// Reductions over the operands of one op: all_reduce across the IPUs of one replica (every output
// gets the reduction, or its own input with `identity`) and add_n (one output; operands broadcast).
KernelFactory operand_reduce(bool add_n) {
  return [add_n](const OpInstr& ins, const std::vector<Buffer>& bufs) -> unique_ptr<Kernel> {
    RedOp op = RedOp::Add;
    const Buffer& y0 = bufs[ins.outputs[0]];
    if ((!add_n && !red_op(ins.attr_str("op"), op)) || y0.dtype == DType::Bool || !dispatch_arith(y0.dtype, [](auto) {}))
      return nullptr;
    const bool identity = !add_n && ins.attr_bool("identity");
    std::vector<Buffer> xs, ys;
    for (int i : ins.inputs) {  // each operand seen with the output's shape (stride 0 where broadcast)
      Buffer v = bufs[i];
      v.strides = broadcast_strides(v, y0.shape);
      v.shape = y0.shape;
      refresh(v);
      xs.push_back(v);
    }
    for (int o : ins.outputs) ys.push_back(bufs[o]);
    if (add_n) {
      if (auto k = add_n_in_place(xs, ys[0])) return k;
    }
    auto scratch = std::make_shared<std::vector<std::vector<uint8_t>>>(xs.size() + 1);
    return std::make_unique<FnKernel>([=](uint8_t* a) {
      auto& s = *scratch;
      const Buffer packed = packed_like(y0);
      for (size_t i = 0; i < xs.size(); ++i) {
        s[i].resize(y0.nbytes());
        copy_buffer(s[i].data(), packed, a, xs[i]);
      }
      if (!identity) {
        s.back().resize(y0.nbytes());
        dispatch_arith(y0.dtype, [&](auto tag) {
          using T = typename decltype(tag)::type;
          std::vector<const T*> ptrs;
          for (size_t i = 0; i < xs.size(); ++i) ptrs.push_back(reinterpret_cast<const T*>(s[i].data()));
          reduce_members<T>(op, ptrs, reinterpret_cast<T*>(s.back().data()), y0.nelms);
        });
      }
      for (size_t i = 0; i < ys.size(); ++i) copy_buffer(a, ys[i], (identity ? s[i] : s.back()).data(), packed);
    });
  };
}

const RegisterKernel operand_reduce_ops[] = {
    {{"all_reduce"}, operand_reduce(false)},
    {{"add_n"}, operand_reduce(true)},
};

}  // namespace
}  // namespace popxl
