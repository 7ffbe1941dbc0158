#pragma once
// Deprecated, kept for one release: spec/ is now score/ (issue 33; the folder is named for what
// its concept does, score the cached rows). This header forwards to kvscout/score/infinigen_device.hpp.
#pragma message("kvscout/spec/infinigen_device.hpp is deprecated: include kvscout/score/infinigen_device.hpp")
#include "kvscout/score/infinigen_device.hpp"
