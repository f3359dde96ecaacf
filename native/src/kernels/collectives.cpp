// Collectives across replicas (replicated_all_reduce(_), replicated_reduce_scatter,
// replicated_all_gather, replica_sharded_slice, replicated_slice) and all_reduce across the IPUs
// of one replica. Replicas share one process, so a collective reads every member's arena
// directly. Reductions follow NumPy's along a stacked member axis: members are combined in
// replica order; float16 sums round at every step, means accumulate in float32 (float64 for
// integers, truncated back); integer sums and products wrap.
#include <cmath>
#include <cstring>
#include <map>

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

// out[e] = reduction over members m of x[m][e] (all packed, n elements).
template <class T>
void reduce_members(RedOp op, const std::vector<const T*>& x, T* out, int64_t n) {
  using W = typename Wide<T>::type;
  const size_t members = x.size();
  for (int64_t e = 0; e < n; ++e) {
    if constexpr (std::is_integral_v<T>) {
      uint64_t acc = op == RedOp::Mul ? 1 : 0;
      double mean = 0;
      T ext = x[0][e];
      bool all = true, any = false;
      for (size_t m = 0; m < members; ++m) {
        const T v = x[m][e];
        const uint64_t u = static_cast<uint64_t>(static_cast<int64_t>(v));
        if (op == RedOp::Add) acc += u;
        if (op == RedOp::SquareAdd) acc += static_cast<uint64_t>(static_cast<T>(u * u));  // squares wrap in T
        if (op == RedOp::Mul) acc *= u;
        mean += double(v);
        if (op == RedOp::Min && v < ext) ext = v;
        if (op == RedOp::Max && v > ext) ext = v;
        all = all && v != 0;
        any = any || v != 0;
      }
      switch (op) {
        case RedOp::Mean: out[e] = convert<T>(mean / double(members)); break;
        case RedOp::Min: case RedOp::Max: out[e] = ext; break;
        case RedOp::And: out[e] = T(all); break;
        case RedOp::Or: out[e] = T(any); break;
        default: out[e] = static_cast<T>(acc);
      }
    } else {
      T acc = x[0][e];
      W mean = 0;
      bool all = true, any = false, nan = false;
      for (size_t m = 0; m < members; ++m) {
        const T v = x[m][e];
        const W w = W(v);
        if (m > 0 && op == RedOp::Add) acc = T(W(acc) + w);
        if (m > 0 && op == RedOp::Mul) acc = T(W(acc) * w);
        if (op == RedOp::SquareAdd) acc = m == 0 ? T(w * w) : T(W(acc) + W(T(w * w)));
        if (op == RedOp::Min && w < W(acc)) acc = v;
        if (op == RedOp::Max && w > W(acc)) acc = v;
        mean = mean + w;
        nan = nan || w != w;
        all = all && w != 0;
        any = any || w != 0;
      }
      switch (op) {
        case RedOp::Mean: out[e] = T(mean / W(members)); break;
        case RedOp::Min: case RedOp::Max: out[e] = nan ? T(NAN) : acc; break;  // NaN propagates
        case RedOp::And: out[e] = T(all); break;
        case RedOp::Or: out[e] = T(any); break;
        default: out[e] = acc;
      }
    }
  }
}

// Base of replica collectives: finds the members of each group among the running replicas.
struct Collective : Kernel {
  std::vector<int64_t> assignment;
  void run(uint8_t*) override { throw std::logic_error("collectives run through run_all"); }
  bool spans_replicas() const override { return true; }
  void run_all(const std::vector<uint8_t*>& arenas, const std::vector<int>& replicas) override {
    std::map<int64_t, std::vector<int>> groups;
    for (int r : replicas) groups[assignment.at(r)].push_back(r);
    for (auto& [g, members] : groups) {
      size_t expected = 0;
      for (auto a : assignment) expected += a == g;
      if (members.size() != expected)
        throw std::runtime_error("a collective ran on only part of its replica group (inside a conditional "
                                 "taken differently by different replicas?)");
      group(arenas, members);
    }
  }
  virtual void group(const std::vector<uint8_t*>& arenas, const std::vector<int>& members) = 0;
};

// The flattened, zero-padded chunk j of n of `packed` bytes (size `chunk` elements).
void shard_into(uint8_t* dst, const uint8_t* packed, int64_t total, int64_t chunk, int64_t j, size_t item) {
  const int64_t begin = std::min(total, j * chunk), end = std::min(total, (j + 1) * chunk);
  std::memcpy(dst, packed + begin * item, (end - begin) * item);
  std::memset(dst + (end - begin) * item, 0, (chunk - (end - begin)) * item);
}

// all-reduce, and reduce-scatter (all-reduce, then each member keeps its shard).
struct AllReduce : Collective {
  Buffer x, y;
  RedOp op;
  bool scatter = false;
  std::vector<std::vector<uint8_t>> inputs;
  std::vector<uint8_t> result, shard;
  void group(const std::vector<uint8_t*>& arenas, const std::vector<int>& members) override {
    const Buffer px = packed_like(x);
    inputs.resize(members.size());
    for (size_t m = 0; m < members.size(); ++m) {  // read everything first: outputs may alias inputs
      inputs[m].resize(x.nbytes());
      copy_buffer(inputs[m].data(), px, arenas[members[m]], x);
    }
    result.resize(x.nbytes());
    dispatch_arith(x.dtype, [&](auto tag) {
      using T = typename decltype(tag)::type;
      std::vector<const T*> ptrs;
      for (auto& v : inputs) ptrs.push_back(reinterpret_cast<const T*>(v.data()));
      reduce_members<T>(op, ptrs, reinterpret_cast<T*>(result.data()), x.nelms);
    });
    const Buffer py = packed_like(y);
    for (size_t m = 0; m < members.size(); ++m) {
      if (!scatter) {
        copy_buffer(arenas[members[m]], y, result.data(), py);
        continue;
      }
      shard.resize(y.nbytes());
      shard_into(shard.data(), result.data(), x.nelms, y.nelms, static_cast<int64_t>(m), itemsize(x.dtype));
      copy_buffer(arenas[members[m]], y, shard.data(), py);
    }
  }
};

KernelFactory all_reduce(bool scatter) {
  return [scatter](const OpInstr& ins, const std::vector<Buffer>& bufs) -> unique_ptr<Kernel> {
    auto k = std::make_unique<AllReduce>();
    k->x = bufs[ins.inputs[0]];
    k->y = bufs[ins.outputs[0]];
    k->assignment = ins.attrs.at("groups").ints();
    k->scatter = scatter;
    if (!red_op(ins.attrs.at("op").s(), k->op) || k->x.dtype == DType::Bool ||
        !dispatch_arith(k->x.dtype, [](auto) {}))
      return nullptr;
    return k;
  };
}

// Member j's own piece of its input: the flattened shard, or the j-th equal slice along an axis.
struct OwnPiece : Collective {
  Buffer x, y;
  int64_t axis = -1;  // -1: flattened shard
  std::vector<uint8_t> packed, shard;
  void group(const std::vector<uint8_t*>& arenas, const std::vector<int>& members) override {
    for (size_t j = 0; j < members.size(); ++j) {
      uint8_t* a = arenas[members[j]];
      if (axis >= 0) {
        const int64_t len = y.shape[axis];
        copy_buffer(a, y, a, window(x, static_cast<size_t>(axis), static_cast<int64_t>(j) * len, len));
        continue;
      }
      packed.resize(x.nbytes());
      copy_buffer(packed.data(), packed_like(x), a, x);
      shard.resize(y.nbytes());
      shard_into(shard.data(), packed.data(), x.nelms, y.nelms, static_cast<int64_t>(j), itemsize(x.dtype));
      copy_buffer(a, y, shard.data(), packed_like(y));
    }
  }
};

KernelFactory own_piece(bool sliced) {
  return [sliced](const OpInstr& ins, const std::vector<Buffer>& bufs) -> unique_ptr<Kernel> {
    auto k = std::make_unique<OwnPiece>();
    k->x = bufs[ins.inputs[0]];
    k->y = bufs[ins.outputs[0]];
    k->assignment = ins.attrs.at("groups").ints();
    if (sliced) k->axis = ins.attrs.at("axis").i();
    return k;
  };
}

// all-gather: stack (new axis), concatenate along an axis, or reassemble the flattened shards.
struct AllGather : Collective {
  Buffer x, y;
  std::string mode;
  int64_t axis = 0;
  std::vector<uint8_t> flat;
  void group(const std::vector<uint8_t*>& arenas, const std::vector<int>& members) override {
    const size_t n = members.size();
    if (mode == "meta_shape") {
      flat.resize(n * x.nbytes());
      for (size_t m = 0; m < n; ++m) {
        Buffer piece = packed_like(x);
        piece.offset = static_cast<int64_t>(m) * x.nbytes();
        copy_buffer(flat.data(), piece, arenas[members[m]], x);
      }
      for (int r : members) copy_buffer(arenas[r], y, flat.data(), packed_like(y));
      return;
    }
    for (int r : members)
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
        copy_buffer(arenas[r], win, arenas[members[m]], x);
      }
  }
};

const RegisterKernel collective_ops[] = {
    {{"replicated_all_reduce", "replicated_all_reduce_"}, all_reduce(false)},
    {{"replicated_reduce_scatter"}, all_reduce(true)},
    {{"replica_sharded_slice"}, own_piece(false)},
    {{"replicated_slice"}, own_piece(true)},
    {{"replicated_all_gather"}, [](const OpInstr& ins, const std::vector<Buffer>& bufs) -> unique_ptr<Kernel> {
       auto k = std::make_unique<AllGather>();
       k->x = bufs[ins.inputs[0]];
       k->y = bufs[ins.outputs[0]];
       k->assignment = ins.attrs.at("groups").ints();
       k->mode = ins.attrs.at("output_shape").s();
       k->axis = ins.attrs.at("axis").i();
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
    if ((!add_n && !red_op(ins.attrs.at("op").s(), op)) || y0.dtype == DType::Bool || !dispatch_arith(y0.dtype, [](auto) {}))
      return nullptr;
    const bool identity = !add_n && ins.attrs.at("identity").b();
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
