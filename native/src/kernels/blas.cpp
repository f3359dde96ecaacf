// The float32 GEMM libraries (blas.hpp). MKL is not linked: the first time a kernel asks for the
// preferred library on an Intel CPU, `dlopen` opens libpopxl_mkl beside the extension, whose
// dependencies are the `mkl` wheel's LP64, sequential and core layers (found beside libdnnl
// through its run path), with RTLD_LOCAL: MKL's symbols stay out of the process's global scope,
// where other libraries (PyTorch) would take them for their own MKL's (native/CMakeLists.txt). A
// process without the wheel (or on another CPU) uses OpenBLAS and loads nothing of MKL's.
#include "blas.hpp"

#include <cblas.h>
#include <dlfcn.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <mutex>
#include <stdexcept>
#include <string>
#include <sys/stat.h>

namespace popxl {
namespace {

// cblas_sgemm's enumerations (the same numbers in OpenBLAS's and MKL's cblas.h).
constexpr int kRowMajor = 101, kNoTrans = 111, kTrans = 112;

using CblasSgemm = void (*)(int, int, int, int, int, int, float, const float*, int, const float*, int, float, float*,
                            int);
CblasSgemm mkl_cblas_sgemm = nullptr;

void openblas_sgemm(bool ta, bool tb, int m, int n, int k, float alpha, const float* a, int lda, const float* b,
                    int ldb, float beta, float* y, int ldy) {
  scipy_cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, m, n, k, alpha, a,
                    lda, b, ldb, beta, y, ldy);
}

void mkl_sgemm(bool ta, bool tb, int m, int n, int k, float alpha, const float* a, int lda, const float* b, int ldb,
               float beta, float* y, int ldy) {
  mkl_cblas_sgemm(kRowMajor, ta ? kTrans : kNoTrans, tb ? kTrans : kNoTrans, m, n, k, alpha, a, lda, b, ldb, beta, y,
                  ldy);
}

bool file_exists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}

// The directory of this extension (libpopxl_mkl lies beside it).
std::string own_directory() {
  Dl_info info{};
  if (!dladdr(reinterpret_cast<void*>(&own_directory), &info) || !info.dli_fname) return {};
  const std::string path = info.dli_fname;
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? std::string(".") : path.substr(0, slash);
}

// MKL through libpopxl_mkl (LP64 integers, sequential threads: the layers it depends on); false
// (and MKL left unused) when it cannot be had. The layers MKL opens itself at its first call are
// checked first: a missing one is a fatal error inside MKL, which ends the process.
bool load_mkl() {
  // An MKL core that another library of the process loaded (with its own interface and threading
  // layers, perhaps global) would be the one ours shares: its threads, its integers. OpenBLAS then.
  if (void* other = dlopen("libmkl_core.so.3", RTLD_NOW | RTLD_LOCAL | RTLD_NOLOAD)) {
    dlclose(other);
    return false;
  }
  void* h = dlopen((own_directory() + "/libpopxl_mkl.so").c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!h) return false;
  auto unusable = [h] {  // MKL is not kept loaded when it cannot be used
    dlclose(h);
    return false;
  };
  void* core = dlopen("libmkl_core.so.3", RTLD_NOW | RTLD_LOCAL | RTLD_NOLOAD);  // loaded with h
  char origin[4096] = {0};
  const bool located = core && dlinfo(core, RTLD_DI_ORIGIN, origin) == 0;
  if (core) dlclose(core);
  if (!located) return unusable();
  for (const char* part : {"def", "avx2", "avx512"})
    if (!file_exists(std::string(origin) + "/libmkl_" + part + ".so.3")) return unusable();
  auto sgemm = reinterpret_cast<CblasSgemm>(dlsym(h, "cblas_sgemm"));
  if (!sgemm) return unusable();
  mkl_cblas_sgemm = sgemm;
  return true;
}

bool mkl_loaded() {
  static const bool loaded = load_mkl();
  return loaded;
}

bool intel_cpu() {
  static const bool intel = __builtin_cpu_is("intel");
  return intel;
}

// -1: the CPU decides (MKL on Intel CPUs where it loads); else a Blas chosen by set_blas.
std::atomic<int> choice{-1};

// A library name as `choice` holds it (-1 for "auto"); throws for names it does not know and for
// MKL where it cannot be loaded.
int parse(const std::string& name) {
  if (name == "auto") return -1;
  if (name == "openblas") return static_cast<int>(Blas::OpenBlas);
  if (name == "mkl") {
    if (!mkl_loaded())
      throw std::invalid_argument("the MKL library (the `mkl` package's LP64, sequential and core layers) cannot be loaded in this process");
    return static_cast<int>(Blas::Mkl);
  }
  throw std::invalid_argument("unknown BLAS library '" + name + "' (expected 'auto', 'openblas' or 'mkl')");
}

}  // namespace

bool blas_layout(int64_t rows, int64_t cols, int64_t row_stride, int64_t col_stride, BlasLayout& out) {
  if (col_stride == 1 && row_stride >= std::max<int64_t>(cols, 1)) {
    out = {false, row_stride};
    return true;
  }
  if (row_stride == 1 && col_stride >= std::max<int64_t>(rows, 1)) {
    out = {true, col_stride};
    return true;
  }
  return false;
}

Blas preferred_blas() {
  const int c = choice.load();
  if (c >= 0) return static_cast<Blas>(c);
  return intel_cpu() && mkl_loaded() ? Blas::Mkl : Blas::OpenBlas;
}

Sgemm sgemm_of(Blas lib) {
  if (lib == Blas::Mkl) return mkl_sgemm;
  // OpenBLAS's own thread pool stays at one thread (before its first call, hence here: the only
  // way to it).
  static std::once_flag once;
  std::call_once(once, [] { scipy_openblas_set_num_threads(1); });
  return openblas_sgemm;
}

const char* blas_name(Blas lib) { return lib == Blas::Mkl ? "mkl" : "openblas"; }

void set_blas(const std::string& name) { choice.store(parse(name)); }

std::vector<std::string> blas_available() {
  std::vector<std::string> names{"openblas"};
  if (mkl_loaded()) names.push_back("mkl");
  return names;
}

}  // namespace popxl
