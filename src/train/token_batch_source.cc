// Token micro-batches for GPT-2 in llm.c order, over data/DataLoader.
#include <memory>

#include <fmt/format.h>

#include "data/data_loader.h"
#include "data/token_source.h"
#include "train/batch_source.h"

namespace zoe {
namespace {

class TokenBatchSource final : public BatchSource {
 public:
  TokenBatchSource(std::unique_ptr<TokenSource> src, DataLoader loader, int B, int T)
      : src_(std::move(src)), loader_(std::move(loader)), B_(B), T_(T) {}
  Result<Batch> next() override {
    Batch b;
    b.B = B_;
    b.T = T_;
    b.inputs.resize(size_t(B_) * T_);
    b.targets.resize(size_t(B_) * T_);
    ZOE_RETURN_IF_ERROR(loader_.next_batch(b.inputs.data(), b.targets.data()));
    return b;
  }
  DataPosition position() const override {
    auto s = loader_.state();
    return {s.shard, static_cast<int64_t>(s.position)};
  }
  Status seek(const DataPosition& p) override {
    return loader_.restore({p.shard, static_cast<uint64_t>(p.offset)});
  }

 private:
  std::unique_ptr<TokenSource> src_;  // the loader points into it: keep it at a stable address
  DataLoader loader_;
  int B_, T_;
};

}  // namespace

Result<std::unique_ptr<BatchSource>> make_token_source(const std::string& pattern, const std::string& format,
                                                       int vocab_size, int B, int T, int rank, int world) {
  if (pattern.empty()) return Status::Invalid("config key 'zoe.data.train': required for zoe.model.type \"gpt2\"");
  ZOE_ASSIGN_OR_RETURN(TokenFormat f, parse_token_format(format));
  ZOE_ASSIGN_OR_RETURN(TokenSource src, TokenSource::Open(f, pattern, vocab_size));
  auto owned = std::make_unique<TokenSource>(std::move(src));
  ZOE_ASSIGN_OR_RETURN(DataLoader loader, DataLoader::Create(*owned, B, T, rank, world));
  return std::unique_ptr<BatchSource>(new TokenBatchSource(std::move(owned), std::move(loader), B, T));
}

}  // namespace zoe
