#pragma once
// Deprecated, kept for one release: spec/ is now score/ (issue 33; the folder is named for what
// its concept does, score the cached rows). This header forwards to kvscout/score/infinigen.cuh.
#pragma message("kvscout/spec/infinigen.cuh is deprecated: include kvscout/score/infinigen.cuh")
#include "kvscout/score/infinigen.cuh"
