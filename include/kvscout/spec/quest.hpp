#pragma once
// Deprecated, kept for one release: spec/ is now score/ (issue 33; the folder is named for what
// its concept does, score the cached rows). This header forwards to kvscout/score/quest.hpp.
#pragma message("kvscout/spec/quest.hpp is deprecated: include kvscout/score/quest.hpp")
#include "kvscout/score/quest.hpp"
