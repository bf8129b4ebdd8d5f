// `zoe export`: a checkpoint's consolidated fp32 weights as safetensors with the model's tensor
// names (GPT-2: Hugging Face names, loadable by transformers' GPT2LMHeadModel).
#include <filesystem>

#include <fmt/format.h>

#include "ckpt/atomic_file.h"
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
  // Checksums always verified (zoe.checksums is about swap blocks); tensors stream a piece at a
  // time from the rank files into the output, so memory does not grow with the model.
  auto weights = CheckpointWeights::Open(path);
  if (!weights.ok()) return report_error(weights.status());
  CheckpointWeights& ck = *weights.value();
  SafetensorsWriter w;
  size_t count = 0;
  for (size_t u = 0; u < ck.manifest().units.size(); ++u)
    for (const ManifestTensor& t : ck.manifest().units[u].tensors) {
      Status st = w.add_streamed(t.name, DType::kF32, t.shape, [&ck, u, &t](AtomicFile& f) {
        return ck.append_tensor(u, t, f);
      });
      if (!st.ok()) return report_error(st);
      ++count;
    }
  w.set_metadata("format", "pt");
  w.set_metadata("source", path);
  Status st = w.write(a.out);
  if (!st.ok()) return report_error(st);
  fmt::print("wrote {} tensors from {} to {}\n", count, path, a.out);
  return 0;
}

}  // namespace zoe::cli
