// `zoe export`: a checkpoint's consolidated fp32 weights as safetensors with the model's tensor
// names (GPT-2: Hugging Face names, loadable by transformers' GPT2LMHeadModel).
#include <filesystem>

#include <fmt/format.h>

#include "ckpt/checkpoint.h"
#include "ckpt/safetensors_writer.h"
#include "cli/commands.h"

namespace zoe::cli {

int export_command(const ExportArgs& a) {
  std::string path = a.checkpoint;
  // A checkpoint root (zoe.checkpoint.dir) means its newest checkpoint.
  if (!std::filesystem::exists(path + "/manifest.json")) {
    auto latest = latest_checkpoint(path);
    if (!latest.ok()) return report_error(latest.status());
    if (latest->empty())
      return report_error(Status::Invalid(fmt::format("--checkpoint '{}': no checkpoint there", path)));
    path = latest.value();
  }
  auto weights = read_consolidated_weights(path, /*verify=*/true);
  if (!weights.ok()) return report_error(weights.status());
  SafetensorsWriter w;
  for (const NamedTensor& t : *weights) {
    Status st = w.add(t.name, DType::kF32, t.shape, t.values.data());
    if (!st.ok()) return report_error(st);
  }
  w.set_metadata("format", "pt");
  w.set_metadata("source", path);
  Status st = w.write(a.out);
  if (!st.ok()) return report_error(st);
  fmt::print("wrote {} tensors from {} to {}\n", weights->size(), path, a.out);
  return 0;
}

}  // namespace zoe::cli
