#pragma once
// Deprecated, kept for one release: spec/ is now score/ (issue 33; the folder is named for what
// its concept does, score the cached rows). This header forwards to kvscout/score/device_context.hpp.
#pragma message("kvscout/spec/device_context.hpp is deprecated: include kvscout/score/device_context.hpp")
#include "kvscout/score/device_context.hpp"
