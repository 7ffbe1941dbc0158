#pragma once
// Eigen, for offline calibration and the tools' GEMMs. Its own headers trip our warning flags; they
// are not ours to fix, so silence them for Eigen only.

#if defined(__GNUC__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wconversion"
#pragma GCC diagnostic ignored "-Wsign-conversion"
#pragma GCC diagnostic ignored "-Wshadow"
#pragma GCC diagnostic ignored "-Wpedantic"
#pragma GCC diagnostic ignored "-Wunused-parameter"
#if !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#endif
#include <Eigen/Dense>
#if defined(__GNUC__)
#pragma GCC diagnostic pop
#endif
