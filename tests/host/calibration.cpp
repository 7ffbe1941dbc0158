// calibrate_skew's definition (Eigen's SVD), compiled once for every test executable: the tests
// build with KVSCOUT_SEPARATE_CALIBRATION (skew/calibrate.hpp), which leaves them the declaration.
// Inline in each of the seven test files that calibrate, it cost about 95 s of compile time per
// file under ASan + UBSan (docs/testing.md).
#define KVSCOUT_CALIBRATION_IMPLEMENTATION
#include "kvscout/skew/calibrate.hpp"
