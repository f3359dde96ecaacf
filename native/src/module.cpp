// popxl._native: load an Executable (as plain Python data) into the C++ engine and run it.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/map.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/unique_ptr.h>
#include <nanobind/stl/vector.h>

#include <omp.h>

#include <atomic>
#include <chrono>
#include <csignal>

#include "engine.hpp"
#include "instances.hpp"
#include "kernels/blas.hpp"
#include "threads.hpp"

namespace nb = nanobind;
using namespace popxl;

#ifndef POPXL_BUILD_TYPE
#define POPXL_BUILD_TYPE "unknown"
#endif

namespace {

AttrValue to_attr(nb::handle h) {
  AttrValue a;
  if (h.is_none()) return a;
  if (nb::isinstance<nb::bool_>(h)) { a.v = nb::cast<bool>(h); return a; }
  if (nb::isinstance<nb::int_>(h)) { a.v = nb::cast<int64_t>(h); return a; }
  if (nb::isinstance<nb::float_>(h)) { a.v = nb::cast<double>(h); return a; }
  if (nb::isinstance<nb::str>(h)) { a.v = nb::cast<std::string>(h); return a; }
  if (nb::isinstance<nb::dict>(h)) {  // {"dtype": name}
    nb::dict d = nb::borrow<nb::dict>(h);
    if (d.contains("dtype")) { a.v = nb::cast<std::string>(d["dtype"]); return a; }
    throw std::invalid_argument("unsupported attribute dict");
  }
  AttrList list;
  for (nb::handle item : h) list.push_back(to_attr(item));
  a.v = std::move(list);
  return a;
}

std::vector<int64_t> ints(nb::handle h) {
  std::vector<int64_t> v;
  for (nb::handle x : h) v.push_back(nb::cast<int64_t>(x));
  return v;
}

std::vector<CopyPair> pairs(nb::handle h) {
  std::vector<CopyPair> v;
  for (nb::handle p : h) {
    auto ab = ints(p);
    v.push_back({static_cast<int>(ab[0]), static_cast<int>(ab[1])});
  }
  return v;
}

// The fields the loader reads of each instruction kind ("?": may be absent; "if.branch": the
// fields of an if's then/else branches). popxl/compiler/instructions.py declares the same and a
// test holds the two equal; the loader reads fields only through `field`, which refuses a field
// not declared here, so neither side can grow a field alone.
const std::map<std::string, std::vector<std::string>>& instruction_fields() {
  static const std::map<std::string, std::vector<std::string>> table = {
      {"op", {"type", "name", "inputs", "outputs", "attrs", "static_inputs?"}},
      {"copy", {"src", "dst"}},
      {"call", {"graph", "copy_in", "copy_out"}},
      {"repeat", {"graph", "count", "copy_in", "carry", "copy_out"}},
      {"if", {"cond", "then", "else"}},
      {"if.branch", {"graph", "copy_in", "copy_out"}},
      {"host_load", {"stream", "output"}},
      {"host_store", {"stream", "input"}},
  };
  return table;
}

bool declared(const std::string& kind, const std::string& name, bool optional) {
  const auto& fields = instruction_fields().at(kind);
  return std::find(fields.begin(), fields.end(), optional ? name + "?" : name) != fields.end();
}

// Field `name` of instruction `ins` of kind `kind`; nullptr-handle if an optional field is absent.
nb::handle field(nb::handle ins, const std::string& kind, const char* name, bool optional = false) {
  if (!declared(kind, name, optional))
    throw std::logic_error(std::string("native loader: field '") + name + "' of '" + kind +
                           "' instructions is not declared in instruction_fields()");
  if (!PyDict_Check(ins.ptr()))
    throw std::invalid_argument(std::string("executable: a '") + kind + "' instruction is not a dict");
  PyObject* value = PyDict_GetItemString(ins.ptr(), name);  // borrowed: the program holds it
  if (!value && !optional)
    throw std::invalid_argument(std::string("executable: a '") + kind + "' instruction has no field '" + name + "'");
  return nb::handle(value);
}

// Runs an op through a Python callback (the reference kernel) when there is no native kernel.
struct PyFallback : Kernel {
  nb::object callback;
  int index;
  PyFallback(nb::object cb, int i) : callback(std::move(cb)), index(i) {}
  void run(uint8_t*) override { throw std::logic_error("PyFallback runs through run_all"); }
  bool spans_replicas() const override { return true; }  // a reference collective needs every replica
  void run_all(const std::vector<uint8_t*>&, const std::vector<int>& replicas) override {
    nb::gil_scoped_acquire gil;
    callback(index, replicas);
  }
};

// Whether an op's "layouts" attribute (popxl.transforms.keep_channels_last) puts an operand in NHWC.
bool keeps_channels_last(const OpInstr& op) {
  if (!op.declares("layouts") || op.attr_is_none("layouts")) return false;
  for (auto& l : op.attr_strs("layouts"))
    if (l == "nhwc") return true;
  return false;
}

// An op instruction's attributes against its type's declaration: every attribute declared, every
// declared one given (unless "?"), each of its declared type.
void check_attributes(const OpInstr& op) {
  if (!op.declared) return;
  const std::string where = "executable: op '" + op.name + "' (" + op.type + "): attribute '";
  for (auto& [name, value] : op.attr_values) {
    auto d = op.declared->find(name);
    if (d == op.declared->end())
      throw std::invalid_argument(where + name + "' is not declared by op '" + op.type + "'");
    if (!attr_conforms(d->second, value))
      throw std::invalid_argument(where + name + "' is not of its declared type " + d->second);
  }
  for (auto& [name, type] : *op.declared)
    if (type.back() != '?' && !op.attr_values.count(name))
      throw std::invalid_argument(where + name + "' of op '" + op.type + "' is missing");
}

std::unique_ptr<Engine> load(nb::dict exe, nb::object fallback, nb::object force_fallback) {
  auto e = std::make_unique<Engine>();
  e->arena_bytes = nb::cast<int64_t>(exe["arena_bytes"]);
  e->replicas = nb::cast<int>(exe["replication_factor"]);
  if (exe.contains("static_graph")) e->static_graph = nb::cast<int>(exe["static_graph"]);
  for (nb::handle b : exe["buffers"]) {
    Buffer buf;
    buf.offset = nb::cast<int64_t>(b["offset"]);
    buf.shape = ints(b["shape"]);
    buf.strides = ints(b["strides"]);
    buf.dtype = dtype_from_name(nb::cast<std::string>(b["dtype"]));
    int64_t expect = static_cast<int64_t>(itemsize(buf.dtype));
    for (size_t i = buf.shape.size(); i-- > 0;) {
      buf.nelms *= buf.shape[i];
      if (buf.shape[i] != 1 && buf.strides[i] != expect) buf.contiguous = false;
      expect *= buf.shape[i];
    }
    e->buffers.push_back(std::move(buf));
  }
  for (nb::handle c : exe["constants"]) {
    nb::bytes data = nb::cast<nb::bytes>(c["data"]);
    e->constants.emplace_back(nb::cast<int>(c["buffer"]), std::string(data.c_str(), data.size()));
  }
  for (auto [key, table] : {std::pair{"h2d", &e->h2d}, std::pair{"d2h", &e->d2h}}) {
    for (nb::handle s : exe[key]) {
      StreamInfo info;
      info.name = nb::cast<std::string>(s["name"]);
      info.slice_bytes = static_cast<int64_t>(itemsize(dtype_from_name(nb::cast<std::string>(s["dtype"]))));
      for (auto d : ints(s["shape"])) info.slice_bytes *= d;
      table->push_back(info);
    }
  }
  if (exe.contains("op_attrs"))
    for (auto [type, decl] : nb::cast<nb::dict>(exe["op_attrs"])) {
      AttrDecl& d = e->op_attrs[nb::cast<std::string>(type)];
      for (auto [name, t] : nb::cast<nb::dict>(decl)) d[nb::cast<std::string>(name)] = nb::cast<std::string>(t);
    }
  std::vector<std::string> forced;
  for (nb::handle f : force_fallback) forced.push_back(nb::cast<std::string>(f));
  auto& registry = kernel_registry();
  for (nb::handle g : exe["graphs"]) {
    std::vector<Node> nodes;
    for (nb::handle ins : g["program"]) {
      const std::string kind = nb::cast<std::string>(ins["kind"]);
      if (!instruction_fields().count(kind)) throw std::invalid_argument("unknown instruction kind " + kind);
      auto get = [&](const char* name) { return field(ins, kind, name); };
      Node n;
      if (kind == "op") {
        n.kind = Node::Op;
        OpInstr op;
        op.type = nb::cast<std::string>(get("type"));
        op.name = nb::cast<std::string>(get("name"));
        for (auto v : ints(get("inputs"))) op.inputs.push_back(static_cast<int>(v));
        for (auto v : ints(get("outputs"))) op.outputs.push_back(static_cast<int>(v));
        if (nb::handle st = field(ins, kind, "static_inputs", true); st.is_valid())
          for (auto v : ints(st)) op.static_inputs.push_back(static_cast<int>(v));
        nb::dict attrs = nb::cast<nb::dict>(get("attrs"));
        for (auto [k, v] : attrs) op.attr_values[nb::cast<std::string>(k)] = to_attr(v);
        if (auto d = e->op_attrs.find(op.type); d != e->op_attrs.end()) op.declared = &d->second;
        check_attributes(op);
        std::unique_ptr<Kernel> k;
        auto it = registry.find(op.type);
        bool force = std::find(forced.begin(), forced.end(), op.type) != forced.end();
        if (it != registry.end() && !force) k = it->second(op, e->buffers);
        if (!k && keeps_channels_last(op))  // the NumPy kernel would read NHWC memory as NCHW
          throw std::invalid_argument("op '" + op.name + "' (" + op.type + ") has channels-last operands, which "
                                      "only its native kernel reads, but " +
                                      (force ? std::string("force_fallback names it")
                                             : std::string("that kernel cannot run it (dtypes or oneDNN)")));
        const int index = static_cast<int>(e->kernels.size());
        if (!k) k = std::make_unique<PyFallback>(fallback, index);
        k->bind_weights_epoch(e->weights_epoch());
        n.kernel = index;
        e->scratch_bytes = std::max(e->scratch_bytes, k->scratch_bytes());
        e->kernels.push_back(std::move(k));
        e->op_instrs.push_back(std::move(op));
      } else if (kind == "copy") {
        n.kind = Node::Copy;
        n.src = nb::cast<int>(get("src"));
        n.dst = nb::cast<int>(get("dst"));
      } else if (kind == "call" || kind == "repeat") {
        n.kind = kind == "call" ? Node::Call : Node::Repeat;
        n.graph = nb::cast<int>(get("graph"));
        n.copy_in = pairs(get("copy_in"));
        n.copy_out = pairs(get("copy_out"));
        if (kind == "repeat") {
          n.count = nb::cast<int64_t>(get("count"));
          n.carry = pairs(get("carry"));
        }
      } else if (kind == "if") {
        n.kind = Node::If;
        n.cond = nb::cast<int>(get("cond"));
        nb::handle t = get("then"), f = get("else");
        n.graph = nb::cast<int>(field(t, "if.branch", "graph"));
        n.copy_in = pairs(field(t, "if.branch", "copy_in"));
        n.copy_out = pairs(field(t, "if.branch", "copy_out"));
        n.else_graph = nb::cast<int>(field(f, "if.branch", "graph"));
        n.else_in = pairs(field(f, "if.branch", "copy_in"));
        n.else_out = pairs(field(f, "if.branch", "copy_out"));
      } else {  // host_load, host_store
        n.kind = kind == "host_load" ? Node::HostLoad : Node::HostStore;
        n.stream = nb::cast<int>(get("stream"));
        n.buffer = nb::cast<int>(get(kind == "host_load" ? "output" : "input"));
      }
      nodes.push_back(std::move(n));
    }
    e->graphs.push_back(std::move(nodes));
  }
  InstanceLayout alone;  // until set_layout says otherwise, one instance runs every replica
  alone.local = alone.global = e->replicas;
  e->set_layout(alone);
  return e;
}

// The C-contiguous bytes of host buffers, through the buffer protocol (cheaper per call than
// ndarray conversion, and indifferent to the dtype), held until the run is over.
class HostBuffers {
 public:
  explicit HostBuffers(size_t n) {
    views_.reserve(n);  // acquire's pointers stay valid
    hosts.reserve(n);
  }
  // One buffer per stream from a list, each checked for its byte count.
  HostBuffers(nb::handle list, const std::vector<StreamInfo>& streams, int64_t transfers, int replicas,
              bool writable, const char* what)
      : HostBuffers(nb::len(list)) {
    if (nb::len(list) != streams.size())
      throw std::invalid_argument(std::string("run: expected ") + std::to_string(streams.size()) + " " + what +
                                  " buffers, got " + std::to_string(nb::len(list)));
    for (size_t i = 0; i < streams.size(); ++i) {
      const Py_buffer* view = acquire(list[i].ptr(), PyBUF_C_CONTIGUOUS | (writable ? PyBUF_WRITABLE : 0), transfers);
      if (view == nullptr) throw nb::python_error();
      const int64_t need = transfers * replicas * streams[i].slice_bytes;
      if (view->len != need)
        throw std::invalid_argument(std::string("run: the ") + what + " buffer of stream '" + streams[i].name +
                                    "' has " + std::to_string(view->len) + " bytes, expected " +
                                    std::to_string(need));
    }
  }
  ~HostBuffers() {
    for (auto& v : views_) PyBuffer_Release(&v);
  }
  HostBuffers(const HostBuffers&) = delete;
  HostBuffers& operator=(const HostBuffers&) = delete;

  // The buffer of `obj` (PyBUF_* `flags`), held from now on as the next stream's host data; nullptr,
  // with Python's error set, where `obj` has none such. At most the constructor's n.
  const Py_buffer* acquire(PyObject* obj, int flags, int64_t transfers) {
    if (views_.size() == views_.capacity()) throw std::logic_error("HostBuffers: more buffers than streams");
    Py_buffer view;
    if (PyObject_GetBuffer(obj, &view, flags) != 0) return nullptr;
    views_.push_back(view);
    hosts.push_back({static_cast<uint8_t*>(view.buf), transfers});
    return &views_.back();
  }
  std::vector<Engine::Host> hosts;

 private:
  std::vector<Py_buffer> views_;
};

// Signals during a run. Python's own C handler only notes a signal; its Python handler (the
// KeyboardInterrupt of Ctrl-C) runs when the main thread next runs Python code, which a run without
// the GIL does not. So a run that has gone on for a while (kWatchAfter) puts this handler in front of
// Python's for the signals that have one: it raises a flag the engine reads between program steps
// and passes the signal on to Python's handler. When the flag is up, the run takes the GIL and lets
// Python handle the signal; if the handler raises, the run stops there with that exception.
// Short runs never touch the signal dispositions (two system calls per signal).
std::atomic<bool> g_signal_pending{false};
struct sigaction g_python_action[NSIG];
const int kWatchedSignals[] = {SIGINT, SIGTERM, SIGHUP, SIGALRM, SIGUSR1, SIGUSR2};

void on_signal(int sig, siginfo_t* info, void* context) {
  g_signal_pending.store(true, std::memory_order_relaxed);
  const struct sigaction& py = g_python_action[sig];
  if (py.sa_flags & SA_SIGINFO)
    py.sa_sigaction(sig, info, context);
  else if (py.sa_handler != SIG_DFL && py.sa_handler != SIG_IGN)
    py.sa_handler(sig);
}

class SignalWatch {
 public:
  static constexpr auto kWatchAfter = std::chrono::milliseconds(20);
  // Only the main thread's runs watch: Python handles signals on that thread alone.
  explicit SignalWatch(bool main_thread) : enabled_(main_thread), start_(std::chrono::steady_clock::now()) {}
  SignalWatch(const SignalWatch&) = delete;
  SignalWatch& operator=(const SignalWatch&) = delete;
  ~SignalWatch() { uninstall(); }

  // Called by the engine between steps (without the GIL).
  void poll() {
    if (!installed_.empty()) {
      if (g_signal_pending.exchange(false, std::memory_order_relaxed)) handle();
      return;
    }
    if (!enabled_ || std::chrono::steady_clock::now() - start_ < kWatchAfter) return;
    enabled_ = false;  // install once per run, whatever happens
    install();
    handle();  // a signal that came before the handler was in front is only in Python's flag
  }

 private:
  bool enabled_;
  std::chrono::steady_clock::time_point start_;
  std::vector<int> installed_;

  static void handle() {
    nb::gil_scoped_acquire gil;
    if (PyErr_CheckSignals() != 0) throw nb::python_error();
  }
  void install() {
    g_signal_pending.store(false, std::memory_order_relaxed);
    for (int sig : kWatchedSignals) {
      struct sigaction current {};
      if (sigaction(sig, nullptr, &current) != 0) continue;
      const bool is_function = (current.sa_flags & SA_SIGINFO) ||
                               (current.sa_handler != SIG_DFL && current.sa_handler != SIG_IGN);
      if (!is_function) continue;  // default or ignored: nothing of Python's to wake
      g_python_action[sig] = current;
      struct sigaction ours = current;
      ours.sa_flags |= SA_SIGINFO;
      ours.sa_sigaction = &on_signal;
      if (sigaction(sig, &ours, nullptr) == 0) installed_.push_back(sig);
    }
    if (installed_.empty()) installed_.push_back(0);  // nothing to watch; don't try again
  }
  void uninstall() {
    for (int sig : installed_) {
      if (sig == 0) continue;
      struct sigaction current {};
      // Put Python's handler back unless something replaced ours meanwhile.
      if (sigaction(sig, nullptr, &current) == 0 && (current.sa_flags & SA_SIGINFO) &&
          current.sa_sigaction == &on_signal)
        sigaction(sig, &g_python_action[sig], nullptr);
    }
    installed_.clear();
  }
};

// Whether the calling thread is Python's main thread (the one its signal handlers run on).
bool on_main_thread() {
  static const unsigned long main_ident =
      nb::cast<unsigned long>(nb::module_::import_("threading").attr("main_thread")().attr("ident"));
  return PyThread_get_thread_ident() == main_ident;
}

void run_buffers(Engine& e, const HostBuffers& ins, const HostBuffers& outs) {
  SignalWatch watch(on_main_thread());
  const std::function<void()> poll = [&watch] { watch.poll(); };
  nb::gil_scoped_release release;
  e.run(ins.hosts, outs.hosts, &poll);
}

void run(Engine& e, nb::handle inputs, nb::handle outputs) {
  HostBuffers ins(inputs, e.h2d, e.transfers, e.replicas, false, "input");
  HostBuffers outs(outputs, e.d2h, e.transfers, e.replicas, true, "output");
  run_buffers(e, ins, outs);
}

// Session.run's fast path. Host data that already is exactly what the engine takes -- a dict with,
// for each stream in the engine's order, a NumPy array (not a subclass) of the stream's dtype and
// host shape, C-contiguous, writable for outputs -- runs with no Python between the call and the
// engine; anything else returns None, and the session's Python path converts it or says what is
// wrong. Without given outputs it makes them (the session's allocators) and returns
// {stream: array}, in the engine's order.
class ExactRunner {
 public:
  ExactRunner(nb::handle engine, nb::handle in_streams, nb::handle in_templates, nb::handle out_streams,
              nb::handle out_makers)
      : engine_obj_(nb::borrow(engine)), ndarray_(nb::module_::import_("numpy").attr("ndarray")) {
    if (!nb::isinstance<Engine>(engine)) throw std::invalid_argument("ExactRunner: `engine` must be an Engine");
    engine_ = nb::inst_ptr<Engine>(engine);
    const Engine& e = *engine_;
    if (nb::len(in_streams) != e.h2d.size() || nb::len(in_templates) != e.h2d.size() ||
        nb::len(out_streams) != e.d2h.size() || nb::len(out_makers) != e.d2h.size())
      throw std::invalid_argument("ExactRunner: one stream and template (maker) per engine stream expected");
    for (size_t i = 0; i < e.h2d.size(); ++i) in_.push_back(slot(in_streams[i], in_templates[i], e.h2d[i], {}));
    for (size_t i = 0; i < e.d2h.size(); ++i) {
      nb::handle maker = out_makers[i];  // (callable, args)
      nb::object made = maker[0](*maker[1]);
      out_.push_back(slot(out_streams[i], made, e.d2h[i], nb::borrow(maker)));
    }
  }

  nb::object call(nb::handle inputs, nb::handle outputs) {
    Engine& e = *engine_;
    if (!e.attached()) return nb::none();
    HostBuffers ins(in_.size()), outs(out_.size());
    if (!gather(inputs, in_, false, ins)) return nb::none();
    nb::object result;
    if (outputs.is_none()) {
      nb::dict made;
      for (const Slot& s : out_) {
        nb::object a = nb::steal(PyObject_Call(s.maker[0].ptr(), s.maker[1].ptr(), nullptr));
        if (!a.is_valid() || outs.acquire(a.ptr(), PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE, e.transfers) == nullptr)
          throw nb::python_error();
        made[s.stream] = a;
      }
      result = std::move(made);
    } else {
      if (!gather(outputs, out_, true, outs)) return nb::none();
      result = nb::borrow(outputs);
    }
    run_buffers(e, ins, outs);
    return result;
  }

 private:
  struct Slot {
    nb::object stream, maker;
    std::string format;  // the buffer protocol's, as NumPy reports the stream's dtype
    std::vector<Py_ssize_t> shape;
  };
  nb::object engine_obj_;  // keeps engine_ alive
  nb::object ndarray_;     // numpy.ndarray: subclasses take the checked path
  Engine* engine_ = nullptr;
  std::vector<Slot> in_, out_;

  Slot slot(nb::handle stream, nb::handle templ, const StreamInfo& info, nb::object maker) {
    Py_buffer view;
    if (PyObject_GetBuffer(templ.ptr(), &view, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) != 0) throw nb::python_error();
    Slot s{nb::borrow(stream), std::move(maker), view.format ? view.format : "B",
           std::vector<Py_ssize_t>(view.shape, view.shape + view.ndim)};
    const int64_t need = engine_->transfers * engine_->replicas * info.slice_bytes;
    const Py_ssize_t len = view.len;
    PyBuffer_Release(&view);
    if (len != need)
      throw std::invalid_argument("ExactRunner: the template of stream '" + info.name + "' has " +
                                  std::to_string(len) + " bytes, the engine moves " + std::to_string(need));
    return s;
  }

  // The arrays of dict `given`, one per slot, into `into`; false where they are not exactly the slots'.
  bool gather(nb::handle given, const std::vector<Slot>& slots, bool writable, HostBuffers& into) const {
    if (given.is_none()) return slots.empty();
    PyObject* dict = given.ptr();
    if (!PyDict_CheckExact(dict) || PyDict_GET_SIZE(dict) != static_cast<Py_ssize_t>(slots.size())) return false;
    const int flags = PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | (writable ? PyBUF_WRITABLE : 0);
    Py_ssize_t pos = 0;
    PyObject *key, *value;
    for (const Slot& s : slots) {
      // keyed in the engine's order: matched by identity, without hashing
      if (!PyDict_Next(dict, &pos, &key, &value)) return false;
      if (key != s.stream.ptr() && (value = PyDict_GetItemWithError(dict, s.stream.ptr())) == nullptr) {
        PyErr_Clear();
        return false;
      }
      if (reinterpret_cast<PyObject*>(Py_TYPE(value)) != ndarray_.ptr()) return false;
      const Py_buffer* view = into.acquire(value, flags, engine_->transfers);
      if (view == nullptr) {
        PyErr_Clear();
        return false;
      }
      if (view->format == nullptr || s.format != view->format ||
          !std::equal(s.shape.begin(), s.shape.end(), view->shape, view->shape + view->ndim))
        return false;
    }
    return true;
  }
};

}  // namespace

NB_MODULE(_native, m) {
  m.doc() = "popxl-cpu native engine";
  nb::exception<InstanceError>(m, "InstanceError", PyExc_RuntimeError);
  m.def("set_peer_state", [](int instance, int state, const std::string& message) {
    if (state < 0 || state > 2) throw std::invalid_argument("peer state must be 0 (running), 1 (finished) or 2 (failed)");
    set_peer_state(instance, static_cast<PeerState>(state), message);
  }, nb::arg("instance"), nb::arg("state"), nb::arg("message"),
        "What popdist knows of another instance of the launch (0 running, 1 finished, 2 failed, with why): "
        "collectives waiting for instances stop with InstanceError when one failed or when the one they wait "
        "for finished.");
  m.def("reset_peer_states", &reset_peer_states, "Forget every instance's state (all running).");
  // libgomp's thread pool (oneDNN's) does not survive fork(): in a child of a process whose engine
  // ran parallel regions, the next one would wait forever for the parent's threads. A child
  // therefore runs every region on its one thread (nthreads 1 never touches the pool); the engine's
  // own team (threads.hpp) takes its thread count from the same setting.
  m.def("after_fork_in_child", []() { omp_set_num_threads(1); },
        "Make this process's parallel regions single-threaded (called in a child after fork()).");
  m.def("team_shares", [](int64_t items, int64_t fail_at) {
    std::vector<int> taken(size_t(std::max<int64_t>(items, 0)), -1);
    threads::region([&](int id, int team) {
      for (int64_t i : threads::share(items, id, team)) {
        if (i == fail_at) throw std::invalid_argument("item " + std::to_string(i) + " failed on thread " + std::to_string(id));
        taken[size_t(i)] = id;
      }
    });
    return taken;
  }, nb::arg("items"), nb::arg("fail_at") = -1,
        "For tests of the engine's thread team: the thread that took each of `items` items in one "
        "region (static shares); item `fail_at` throws ValueError instead.");
  m.def("abi_version", []() { return 3; },
        "Version of the executable contract this engine implements (popxl.compiler.executable.VERSION).");
  m.def("instruction_fields", []() { return instruction_fields(); },
        "The fields the loader reads of each instruction kind ('?': optional; 'if.branch': an if's branches).");
  m.def("build_info", []() {
    nb::dict info;
#if defined(__clang__)
    info["compiler"] = std::string("clang ") + __clang_version__;
#elif defined(__GNUC__)
    info["compiler"] = std::string("gcc ") + __VERSION__;
#else
    info["compiler"] = std::string("unknown");
#endif
    info["cplusplus"] = static_cast<long>(__cplusplus);
#ifdef POPXL_HAVE_OPENMP
    info["openmp"] = true;
#else
    info["openmp"] = false;
#endif
    info["build_type"] = std::string(POPXL_BUILD_TYPE);
    return info;
  }, "How this extension was compiled.");
  m.def("set_blas", &set_blas, nb::arg("name"),
        "Which library's sgemm float32 products built from now on use: 'auto' (MKL on Intel CPUs where "
        "the `mkl` package loads, else OpenBLAS), 'openblas' or 'mkl'. ValueError for an unknown name or a "
        "library this process cannot load.");
  m.def("blas_available", &blas_available, "The sgemm libraries this process can use, by name.");
  m.def("preferred_blas", []() { return std::string(blas_name(preferred_blas())); },
        "The library products built now would use (the CPU's choice or set_blas's).");
  m.def("kernel_names", []() {
    std::vector<std::string> names;
    for (auto& [k, _] : kernel_registry()) names.push_back(k);
    return names;
  }, "Ops that have a native kernel (for some dtypes).");

  nb::class_<Engine>(m, "Engine")
      .def_static("load", &load, nb::arg("executable"), nb::arg("fallback"), nb::arg("force_fallback"),
                  "Prepare an executable (its plain-data dict form). `fallback(kernel_index, replicas)` runs "
                  "ops that have no native kernel.")
      .def("attach", &Engine::attach)
      .def("detach", &Engine::detach, "Release the device memory (and leave the other instances).")
      .def("set_layout", [](Engine& e, int index, int count, int local, int global) {
        if (count < 1 || index < 0 || index >= count || local < 1 || global != local * count)
          throw std::invalid_argument("set_layout: instance " + std::to_string(index) + " of " + std::to_string(count) +
                                      " with " + std::to_string(local) + " of " + std::to_string(global) +
                                      " replicas is not a launch");
        InstanceLayout l;
        l.index = index;
        l.count = count;
        l.local = local;
        l.global = global;
        e.set_layout(l);
      }, nb::arg("index"), nb::arg("count"), nb::arg("local"), nb::arg("global_replicas"),
         "This process is instance `index` of `count`, each running `local` of the `global_replicas` replicas "
         "(replica groupings and collectives count them all).")
      .def("join", [](Engine& e, uint64_t comm, double timeout) {
        // MPICH's handles are ints; mpi4py shows them as unsigned (sign-extended) integers
        static_assert(sizeof(MPI_Comm) == sizeof(uint32_t), "MPICH ABI: MPI_Comm is an int");
        const InstanceLayout& l = e.layout();
        e.join(std::make_unique<InstanceLink>(static_cast<MPI_Comm>(static_cast<uint32_t>(comm)), l, timeout));
      }, nb::arg("comm"), nb::arg("timeout"),
         "Link to the other instances over MPI communicator handle `comm` (mpi4py's Comm.handle, MPICH's ABI; "
         "the session's own communicator). Waits for a message longer than `timeout` seconds (0: no limit) "
         "raise InstanceError.")
      .def("leave", &Engine::leave, "Drop the link to the other instances.")
      .def_prop_ro("joined", [](Engine& e) { return e.link() != nullptr; })
      .def_prop_ro("attached", &Engine::attached)
      .def("variables_written", &Engine::variables_written,
           "Say that device variables were written (through the arena): the static program runs "
           "again before the next run, and kernels drop values derived from static storage.")
      .def_ro("replicas", &Engine::replicas)
      .def_ro("scratch_bytes", &Engine::scratch_bytes,
              "Bytes of the one scratch region all kernels share while they run (oneDNN scratchpads, "
              "reordered operands, float16 staging), allocated at attach.")
      .def("arena", [](Engine& e, int r) {
        size_t n = static_cast<size_t>(e.arena_bytes);
        return nb::ndarray<nb::numpy, uint8_t, nb::ndim<1>>(e.arena(r), {n});
      }, nb::rv_policy::reference_internal, "One replica's device memory as a NumPy array (no copy).")
      .def("native_kernels", [](Engine& e) {
        std::vector<bool> v;
        for (auto& k : e.kernels) v.push_back(dynamic_cast<PyFallback*>(k.get()) == nullptr);
        return v;
      }, "For each op instruction: whether it runs natively.")
      .def("kernel_algorithms", [](Engine& e) {
        std::vector<std::string> v;
        for (auto& k : e.kernels) v.push_back(k->algorithm());
        return v;
      }, "For each op instruction: how its kernel computes, where it chooses (e.g. a convolution's "
         "algorithm), else an empty string.")
      .def_prop_rw("profiling", &Engine::profiling, &Engine::set_profiling,
                   "Time every op instruction per replica (setting it resets the profile).")
      .def("reset_profile", &Engine::reset_profile)
      .def("op_profile", [](Engine& e) { return std::make_pair(e.op_seconds, e.op_calls); },
           "(seconds, calls) of each op instruction on each replica since the last reset, flat "
           "[instruction * replicas + replica].")
      .def("transfer_counts", [](Engine& e) { return std::make_pair(e.load_counts(), e.store_counts()); },
           "(host_load counts, host_store counts) of the last run, flat [stream * replicas + replica].")
      .def_prop_rw("transfers", [](Engine& e) { return e.transfers; },
                   [](Engine& e, int64_t n) {
                     if (n < 1) throw std::invalid_argument("transfers must be at least 1, not " + std::to_string(n));
                     e.transfers = n;
                   }, "Host transfers per stream and run (the executable's num_host_transfers; 1 until set).")
      .def("run", &run, nb::arg("inputs"), nb::arg("outputs"),
           "Run the main program once. Host buffers are C-contiguous objects with the buffer protocol "
           "(NumPy arrays of any dtype) holding (transfers, replicas, *stream shape) elements. A run "
           "called from Python's main thread notices signals between program steps and lets their "
           "Python handlers run: an exception raised there (Ctrl-C's KeyboardInterrupt) ends the run.");
  nb::class_<ExactRunner>(m, "ExactRunner",
                          "Session.run's fast path: runs `engine` on a {stream: array} dict that holds exactly "
                          "what it takes (the templates' NumPy dtype and shape, C-contiguous, writable for "
                          "outputs), else returns None.")
      .def(nb::init<nb::handle, nb::handle, nb::handle, nb::handle, nb::handle>(), nb::arg("engine"),
           nb::arg("in_streams"), nb::arg("in_templates"), nb::arg("out_streams"), nb::arg("out_makers"),
           "Streams in the engine's order; an array per input stream showing its host dtype and shape; a "
           "(callable, args) per output stream that makes its host array.")
      .def("__call__", &ExactRunner::call, nb::arg("inputs").none(), nb::arg("outputs").none() = nb::none(),
           "Run once on `inputs` (and fill `outputs`; without them, made and returned as a dict); None, "
           "without running, when they are not exactly what the engine takes or the engine is detached.");
}
