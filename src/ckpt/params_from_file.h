// A model's parameters from a safetensors file (`zoe.init`, zoe_load_safetensors): the reader of
// the file format meets the unit API here, so that no model depends on a file format.
#ifndef ZOE_CKPT_PARAMS_FROM_FILE_H_
#define ZOE_CKPT_PARAMS_FROM_FILE_H_

#include <string>

#include "zoe/engine.h"
#include "zoe/status.h"

namespace zoe {

// Sets every unit's parameters from a safetensors file holding each tensor by its name (or by
// `alt_prefix` + name) with its shape, in any float dtype. Errors are input errors that start with
// `what` and name the file and the tensor.
Status init_params_from_file(Engine& e, const std::string& path, const std::string& alt_prefix,
                             const std::string& what);

}  // namespace zoe

#endif  // ZOE_CKPT_PARAMS_FROM_FILE_H_
