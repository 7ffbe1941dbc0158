// The pipeline instances with 2-bit partial keys (key_bits 2, kvscout_default's): pipeline.hpp.
#include "pipeline.hpp"

namespace kvscout_py {
template std::unique_ptr<pipeline_calls> build_pipeline<kvscout::quantized_keys<2>>(const pipeline_args&);
}  // namespace kvscout_py
