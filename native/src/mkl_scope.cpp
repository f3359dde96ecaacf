// No code: this file builds libpopxl_mkl, whose only content is its dependencies on MKL's layers
// (see "MKL in a scope of its own" in CMakeLists.txt and load_mkl in kernels/blas.cpp), and the
// empty stand-ins it is linked against.
