// Remote memory ops (remote_load, remote_load_, remote_store, remote_code_load) and print_tensor.
//
// Remote ops get their buffer's region (entries, *tensor_shape) as the last input (see
// popxl/ops/remote.py); a load or store copies one slot, bit for bit.
//
// print_tensor lays its text out as the reference's format_tensor does, which is NumPy's
// array2string with a formatter for every element (so elements are not padded to a common width)
// and one-character stand-ins for the separator and the brackets, replaced afterwards. The layout
// below follows array2string's rules (line wrapping, summarisation, hanging indents) including
// the effect of the separator stand-in being whitespace to Python: str.rstrip removes it where a
// line wraps and between rows.
#define PY_SSIZE_T_CLEAN
#include <Python.h>  // first, as Python asks: print_tensor flushes sys.stdout/stderr before it writes

#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <stdexcept>
#include <string>

#include "fp8.hpp"
#include "loops.hpp"

namespace popxl {
namespace {

using std::unique_ptr;

// ---- remote_load / remote_load_ / remote_store ---------------------------------------------------
// Which slot of a remote buffer's region (`entries` slots) the one-element integer tensor
// `offset` names; an offset outside [0, entries) raises IndexError (std::out_of_range) with the
// reference's message.
int64_t remote_slot(const uint8_t* arena, int64_t entries, const Buffer& offset, int64_t buffer_id, const char* op) {
  int64_t slot = -1;
  std::string value;
  dispatch_arith(offset.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    if constexpr (std::is_integral_v<T>) {
      T v;
      std::memcpy(&v, arena + offset.offset, sizeof v);
      bool in_range = static_cast<uint64_t>(v) < static_cast<uint64_t>(entries);
      if constexpr (std::is_signed_v<T>) in_range = in_range && v >= 0;
      if (in_range) slot = static_cast<int64_t>(v);
      else value = std::to_string(v);
    }
  });
  if (slot < 0)
    throw std::out_of_range(std::string(op) + ": offset " + value + " is out of range for remote buffer " +
                            std::to_string(buffer_id) + ", which has " + std::to_string(entries) +
                            " entries (valid offsets 0.." + std::to_string(entries - 1) + ").");
  return slot;
}

enum class Remote { Load, LoadInPlace, Store };

KernelFactory remote(Remote which) {
  return [which](const OpInstr& ins, const std::vector<Buffer>& bufs) -> unique_ptr<Kernel> {
    const char* op = which == Remote::Load ? "remote_load" : which == Remote::LoadInPlace ? "remote_load_" : "remote_store";
    // inputs: (offset, region) for remote_load, (t, offset, region) for the others
    const Buffer& region = bufs[ins.inputs.back()];
    const Buffer& offset = bufs[ins.inputs[which == Remote::Load ? 0 : 1]];
    const Buffer& tensor = which == Remote::Store ? bufs[ins.inputs[0]] : bufs[ins.outputs[0]];
    if (!is_int(offset.dtype)) return nullptr;
    if (std::vector<int64_t>(region.shape.begin() + 1, region.shape.end()) != tensor.shape ||
        region.dtype != tensor.dtype)
      throw std::logic_error(std::string(op) + " '" + ins.name + "': the tensor does not match its remote buffer's slots");
    const int64_t id = ins.attr_int("remote_buffer"), entries = region.shape.at(0);
    Buffer first = region;  // slot 0; slot k lies k region strides further on
    first.shape.erase(first.shape.begin());
    first.strides.erase(first.strides.begin());
    refresh(first);
    return std::make_unique<FnKernel>([=, slot = first, base = first.offset](uint8_t* a) mutable {
      slot.offset = base + remote_slot(a, entries, offset, id, op) * region.strides[0];
      if (which == Remote::Store) copy_buffer(a, slot, a, tensor);
      else copy_buffer(a, tensor, a, slot);
    });
  };
}

const RegisterKernel remote_ops[] = {
    {{"remote_load"}, remote(Remote::Load)},
    {{"remote_load_"}, remote(Remote::LoadInPlace)},
    {{"remote_store"}, remote(Remote::Store)},
    // all code is always resident on the CPU: loading it does nothing
    {{"remote_code_load"}, [](const OpInstr&, const std::vector<Buffer>&) -> unique_ptr<Kernel> {
       return std::make_unique<FnKernel>([](uint8_t*) {});
     }},
};

// ---- print_tensor: the text ------------------------------------------------------------------------
enum class FloatStyle { Auto, Fixed, Scientific, Shortest };

struct PrintFormat {
  int64_t threshold = 1000, edge_items = 3, line_width = 75;
  int digits = 8;
  FloatStyle style = FloatStyle::Auto;
  std::string separator = " ", open = "[", close = "]";  // one character each (UTF-8)
};

// repr(float(v)) as Python writes it: the shortest digits that read back as v, in positional
// notation for decimal exponents in [-4, 16), else d.ddde+XX; whole numbers get ".0".
std::string python_repr(double v) {
  char buf[64];
  const auto res = std::to_chars(buf, buf + sizeof buf, v, std::chars_format::scientific);  // -d.ddde+XX
  const std::string sci(buf, res.ptr);
  const size_t e = sci.find('e');
  const bool negative = sci[0] == '-';
  std::string digits;
  for (size_t i = negative ? 1 : 0; i < e; ++i)
    if (sci[i] != '.') digits += sci[i];
  const int exponent = std::stoi(sci.substr(e + 1));
  const int point = exponent + 1;  // digits are 0.d1d2... * 10**point
  std::string out = negative ? "-" : "";
  const int n = static_cast<int>(digits.size());
  if (point <= -4 || point > 16) {
    out += digits.substr(0, 1);
    if (n > 1) out += "." + digits.substr(1);
    char exp_text[16];
    std::snprintf(exp_text, sizeof exp_text, "e%+.02d", exponent);
    return out + exp_text;
  }
  if (point <= 0) return out + "0." + std::string(-point, '0') + digits;
  if (point >= n) return out + digits + std::string(point - n, '0') + ".0";
  return out + digits.substr(0, point) + "." + digits.substr(point);
}

// One float as Python formats it: f"{v:.{digits}g}" / "f" / "e" or repr (NaN has no sign there).
std::string format_float(double v, const PrintFormat& f) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v < 0 ? "-inf" : "inf";
  if (f.style == FloatStyle::Shortest) return python_repr(v);
  const char* spec = f.style == FloatStyle::Auto ? "%.*g" : f.style == FloatStyle::Fixed ? "%.*f" : "%.*e";
  const int n = std::snprintf(nullptr, 0, spec, f.digits, v);
  std::string out(static_cast<size_t>(n) + 1, '\0');
  std::snprintf(out.data(), out.size(), spec, f.digits, v);
  out.resize(static_cast<size_t>(n));
  return out;
}

// One element: floats (float8 and float16 widened to float64) as above, integers in decimal,
// booleans as true/false.
std::string format_element(const uint8_t* p, DType d, const PrintFormat& f) {
  if (is_fp8(d)) return format_float(fp8_format(d).decode(*p), f);
  std::string out;
  dispatch_numeric(d, [&](auto tag) {
    using T = typename decltype(tag)::type;
    T v;
    std::memcpy(&v, p, sizeof v);
    if constexpr (std::is_same_v<T, bool>) out = v ? "true" : "false";
    else if constexpr (std::is_integral_v<T>) out = std::to_string(v);
    else out = format_float(double(v), f);
  });
  return out;
}

// Stand-ins laid out while the text is built, as in the reference (each one character wide).
constexpr char kSep = '\x1d', kOpen = '\x1e', kClose = '\x1f';

// Python's str.isspace for an ASCII character (the stand-ins \x1c-\x1f included).
bool ascii_space(char c) { return c == ' ' || (c >= '\t' && c <= '\r') || (c >= '\x1c' && c <= '\x1f'); }

// Python's str.isspace for a code point.
bool python_space(uint32_t c) {
  return (c < 0x80 && ascii_space(static_cast<char>(c))) || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

// str.rstrip() of valid UTF-8 text.
void rstrip_utf8(std::string& s) {
  while (!s.empty()) {
    size_t start = s.size() - 1;
    while (start > 0 && (static_cast<uint8_t>(s[start]) & 0xC0) == 0x80) --start;
    const auto* b = reinterpret_cast<const uint8_t*>(s.data() + start);
    const size_t len = s.size() - start;
    uint32_t c = b[0];
    if (len == 2) c = (b[0] & 0x1Fu) << 6 | (b[1] & 0x3Fu);
    else if (len == 3) c = (b[0] & 0x0Fu) << 12 | (b[1] & 0x3Fu) << 6 | (b[2] & 0x3Fu);
    else if (len == 4) c = (b[0] & 0x07u) << 18 | (b[1] & 0x3Fu) << 12 | (b[2] & 0x3Fu) << 6 | (b[3] & 0x3Fu);
    if (!python_space(c)) return;
    s.resize(start);
  }
}

std::string replace_all(std::string s, char from, const std::string& to) {
  std::string out;
  for (char c : s) {
    if (c == from) out += to;
    else out += c;
  }
  return out;
}

// NumPy's array2string layout (its _formatArray) of a strided tensor, with kSep as separator.
class ArrayLayout {
 public:
  ArrayLayout(const uint8_t* arena, const Buffer& b, const PrintFormat& f)
      : arena_(arena), b_(b), f_(f), summarise_(b.nelms > f.threshold) {}

  std::string text() { return nest(0, b_.offset, " ", f_.line_width); }

 private:
  const uint8_t* arena_;
  const Buffer& b_;
  const PrintFormat& f_;
  bool summarise_;

  // Appends `word` to `line`, first moving the line into `s` when the word would pass `width`
  // (unless the line holds only the indent: wrapping would not help).
  static void extend(std::string& s, std::string& line, const std::string& word, int64_t width,
                     const std::string& indent) {
    const bool wrap = int64_t(line.size() + word.size()) > width && line.size() > indent.size();
    if (wrap) {
      size_t end = line.size();
      while (end > 0 && ascii_space(line[end - 1])) --end;
      s += line.substr(0, end) + "\n";
      line = indent;
    }
    line += word;
  }

  // The text of the sub-array at `axis` starting at byte `offset`: its first line starts at
  // `indent` (which is then dropped), and lines are `width` wide.
  std::string nest(size_t axis, int64_t offset, const std::string& indent, int64_t width) {
    const size_t rank = b_.shape.size();
    if (axis == rank) return format_element(arena_ + offset, b_.dtype, f_);
    const int64_t n = b_.shape[axis];
    const bool summary = summarise_ && 2 * f_.edge_items < n;
    const int64_t leading = summary ? f_.edge_items : 0, trailing = summary ? f_.edge_items : n;
    const std::string inner_indent = indent + ' ';
    // item i, or the i-th from the end when i < 0
    auto item = [&](int64_t i) {
      return nest(axis + 1, offset + (i < 0 ? i + n : i) * b_.strides[axis], inner_indent, width - 1);
    };
    std::string s;
    if (axis + 1 == rank) {
      // room for the separator (the stand-in strips to nothing) or the closing bracket
      const int64_t elem_width = width - 1;
      std::string line = indent;
      for (int64_t i = 0; i < leading; ++i) {
        extend(s, line, item(i), elem_width, indent);
        line += kSep;
      }
      if (summary) {
        extend(s, line, "...", elem_width, indent);
        line += kSep;
      }
      for (int64_t i = trailing; i > 1; --i) {
        extend(s, line, item(-i), elem_width, indent);
        line += kSep;
      }
      extend(s, line, item(-1), elem_width, indent);
      s += line;
    } else {
      const std::string row_sep(rank - axis - 1, '\n');  // the separator stand-in strips to nothing
      for (int64_t i = 0; i < leading; ++i) s += indent + item(i) + row_sep;
      if (summary) s += indent + "..." + row_sep;
      for (int64_t i = trailing; i > 1; --i) s += indent + item(-i) + row_sep;
      s += indent + item(-1);
    }
    return "[" + s.substr(std::min(indent.size(), s.size())) + "]";
  }
};

// The reference's format_tensor: the layout, then the stand-ins replaced in its order, then
// trailing whitespace removed from every line.
std::string format_tensor(const uint8_t* arena, const Buffer& x, const PrintFormat& f) {
  std::string text = x.nelms == 0 ? "[]" : x.shape.empty() ? format_element(arena + x.offset, x.dtype, f)
                                                            : ArrayLayout(arena, x, f).text();
  text = replace_all(text, '[', std::string(1, kOpen));
  text = replace_all(text, ']', std::string(1, kClose));
  text = replace_all(text, kOpen, f.open);
  text = replace_all(text, kClose, f.close);
  text = replace_all(text, kSep, f.separator);
  std::string out;
  size_t start = 0;
  while (true) {
    const size_t end = text.find('\n', start);
    std::string line = text.substr(start, end == std::string::npos ? std::string::npos : end - start);
    rstrip_utf8(line);
    out += line;
    if (end == std::string::npos) return out;
    out += '\n';
    start = end + 1;
  }
}

// Writes to the process's standard error, as PopXL's print_tensor does, after flushing Python's
// sys.stdout and sys.stderr, so the text comes after whatever Python printed before the run (the
// engine runs with the GIL released).
void write_stderr(const std::string& text) {
  const PyGILState_STATE gil = PyGILState_Ensure();
  for (const char* name : {"stdout", "stderr"}) {
    PyObject* stream = PySys_GetObject(name);  // borrowed
    if (stream == nullptr || stream == Py_None) continue;
    PyObject* r = PyObject_CallMethod(stream, "flush", nullptr);
    if (r == nullptr) PyErr_Clear();  // a closed or odd stream: still print
    Py_XDECREF(r);
  }
  PyGILState_Release(gil);
  std::fwrite(text.data(), 1, text.size(), stderr);
  std::fflush(stderr);
}

FloatStyle float_style(const std::string& name) {
  if (name == "auto") return FloatStyle::Auto;
  if (name == "fixed") return FloatStyle::Fixed;
  if (name == "scientific") return FloatStyle::Scientific;
  if (name == "none") return FloatStyle::Shortest;
  throw std::invalid_argument("print_tensor: unknown float_format '" + name + "'");
}

// print_tensor: prints "<title>: <values>" (when print_self) and outputs a copy of its input.
// Complex tensors are left to the reference, whose NumPy float layout (common widths, trimmed
// digits) this does not reproduce.
const RegisterKernel print_tensor_op{{"print_tensor"}, [](const OpInstr& ins, const std::vector<Buffer>& bufs) -> unique_ptr<Kernel> {
  const Buffer &x = bufs[ins.inputs[0]], &y = bufs[ins.outputs[0]];
  if (!is_numeric(x.dtype) && !is_fp8(x.dtype)) return nullptr;
  PrintFormat f;
  f.threshold = ins.attr_int("summarise_threshold");
  f.edge_items = ins.attr_int("edge_items");
  f.line_width = ins.attr_int("max_line_width");
  f.digits = static_cast<int>(std::min<int64_t>(ins.attr_int("digits"), 1 << 20));
  f.style = float_style(ins.attr_str("float_format"));
  f.separator = ins.attr_str("separator");
  f.open = ins.attr_str("open_bracket");
  f.close = ins.attr_str("close_bracket");
  const bool print_self = ins.attr_bool("print_self");
  const std::string title = ins.attr_str("title");
  return std::make_unique<FnKernel>([=](uint8_t* a) {
    if (print_self) write_stderr(title + ": " + format_tensor(a, x, f) + "\n");
    copy_buffer(a, y, a, x);
  });
}};

}  // namespace
}  // namespace popxl
