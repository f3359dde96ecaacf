// popxl._native: the C++ engine's Python bindings. Today it only reports how it was built;
// the engine that runs an Executable (see popxl/compiler/executable.py) lands here next.
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>

namespace nb = nanobind;

#ifndef POPXL_BUILD_TYPE
#define POPXL_BUILD_TYPE "unknown"
#endif

NB_MODULE(_native, m) {
  m.doc() = "popxl-cpu native engine";
  m.def("abi_version", []() { return 1; }, "Version of the executable contract this engine implements.");
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
}
