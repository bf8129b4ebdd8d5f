#include "common/config.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <map>
#include <sstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "common/json_depth.h"
#include "common/read_at_most.h"

namespace zoe {
namespace {

using json = nlohmann::json;

// Keys DeepSpeed configs commonly carry that zoe accepts without acting on them: the behaviour
// they select is how zoe always works (e.g. contiguous_gradients) or does not apply (wall_clock_breakdown).
const std::vector<std::string> kAcceptedNoEffect = {
    "zero_optimization.contiguous_gradients",
    "zero_optimization.reduce_scatter", "zero_optimization.allgather_partitions",
    "zero_optimization.round_robin_gradients", "zero_optimization.stage3_gather_16bit_weights_on_model_save",
    "zero_optimization.offload_optimizer.buffer_count", "zero_optimization.offload_optimizer.fast_init",
    "zero_optimization.offload_param.buffer_count", "zero_optimization.offload_param.buffer_size",
    "zero_optimization.offload_param.max_in_cpu", "aio.thread_count", "aio.single_submit", "aio.overlap_events",
    "wall_clock_breakdown", "bf16.immediate_grad_update", "fp16.auto_cast", "optimizer.params.torch_adam",
    "optimizer.params.adam_w_mode", "zoe.data.comment"};

const std::vector<std::string> kKeys = {
    "train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps", "gradient_clipping",
    "bf16.enabled", "fp16.enabled", "fp16.loss_scale", "fp16.initial_scale_power", "fp16.loss_scale_window",
    "fp16.hysteresis", "fp16.min_loss_scale", "optimizer.type", "optimizer.params.lr", "optimizer.params.betas",
    "optimizer.params.eps", "optimizer.params.weight_decay", "scheduler.type", "scheduler.params.warmup_min_lr",
    "scheduler.params.warmup_max_lr", "scheduler.params.warmup_num_steps", "scheduler.params.warmup_type",
    "scheduler.params.total_num_steps", "scheduler.params.warmup_min_ratio", "scheduler.params.cos_min_ratio",
    "zero_optimization.stage", "zero_optimization.overlap_comm", "zero_optimization.reduce_bucket_size",
    "zero_optimization.allgather_bucket_size",
    "zero_optimization.stage3_prefetch_bucket_size", "zero_optimization.stage3_max_live_parameters",
    "zero_optimization.stage3_max_reuse_distance", "zero_optimization.stage3_param_persistence_threshold",
    "zero_optimization.sub_group_size", "zero_optimization.offload_optimizer.device",
    "zero_optimization.offload_optimizer.nvme_path", "zero_optimization.offload_optimizer.pin_memory",
    "zero_optimization.offload_optimizer.ratio", "zero_optimization.offload_param.device",
    "zero_optimization.offload_param.nvme_path", "zero_optimization.offload_param.pin_memory",
    "zero_optimization.offload_param.ratio", "aio.block_size",
    "aio.queue_depth", "steps_per_print", "seed", "zoe.device", "zoe.device_memory_budget", "zoe.host_memory_budget",
    "zoe.model.type", "zoe.model.n_layer", "zoe.model.n_head", "zoe.model.n_embd", "zoe.model.vocab_size",
    "zoe.model.n_positions", "zoe.data.train", "zoe.data.val", "zoe.data.format", "zoe.data.seq_len", "zoe.steps",
    "zoe.eval_every", "zoe.init", "zoe.checkpoint.dir", "zoe.checkpoint.every", "zoe.checkpoint.keep",
    "zoe.checkpoint.verify", "zoe.activation_checkpointing", "zoe.checksums", "zoe.compute_dtype", "zoe.update_in_backward",
    "zoe.allow_tf32", "zoe.nccl_reduce_scatter", "zoe.gpu",
    "data_types.grad_accum_dtype"};

size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (size_t j = 1; j <= b.size(); ++j)
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (a[i - 1] != b[j - 1])});
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

std::string closest_key(const std::string& key) {
  std::string best;
  size_t best_d = SIZE_MAX;
  for (const auto& k : known_config_keys()) {
    size_t d = edit_distance(key, k);
    // A key at the wrong depth ("lr" for "optimizer.params.lr") should still find its home.
    std::string leaf = k.substr(k.rfind('.') + 1);
    if (key == leaf || key.substr(key.rfind('.') + 1) == leaf) d = std::min(d, size_t{2});
    if (d < best_d) best_d = d, best = k;
  }
  return best;
}

void flatten(const json& j, const std::string& prefix, std::map<std::string, json>& out) {
  for (auto it = j.begin(); it != j.end(); ++it) {
    std::string key = prefix.empty() ? it.key() : prefix + "." + it.key();
    if (it->is_object()) flatten(*it, key, out);  // an empty section ("zero_optimization": {}) sets nothing
    else out[key] = *it;
  }
}

// Typed reads of one flattened key, each error naming the key and what was expected.
struct Reader {
  const std::map<std::string, json>& kv;
  const json* find(const std::string& k) const {
    auto it = kv.find(k);
    return it == kv.end() ? nullptr : &it->second;
  }
  Status bad(const std::string& k, const std::string& expected) const {
    return Status::Invalid(fmt::format("config key '{}': expected {}, got {}", k, expected, find(k)->dump()));
  }
  template <typename T>
  Status integer(const std::string& k, T& out, int64_t lo, int64_t hi) const {
    const json* v = find(k);
    if (!v) return Status::Ok();
    const std::string expected = fmt::format("an integer in [{}, {}]", lo, hi);
    if (!v->is_number_integer() && !(v->is_number_float() && std::floor(v->get<double>()) == v->get<double>()))
      return bad(k, expected);
    // A float outside int64's range (1e300, 2^63) has no int64 value: converting it is UB.
    if (v->is_number_float() && !(v->get<double>() >= -0x1p63 && v->get<double>() < 0x1p63))
      return bad(k, expected);
    int64_t x = v->is_number_integer() ? v->get<int64_t>() : static_cast<int64_t>(v->get<double>());
    if (x < lo || x > hi) return bad(k, expected);
    out = static_cast<T>(x);
    return Status::Ok();
  }
  Status number(const std::string& k, double& out, double lo, double hi, const char* what = nullptr) const {
    const json* v = find(k);
    if (!v) return Status::Ok();
    if (!v->is_number() || !std::isfinite(v->get<double>()) || v->get<double>() < lo || v->get<double>() > hi)
      return bad(k, what ? what : fmt::format("a number in [{}, {}]", lo, hi));
    out = v->get<double>();
    return Status::Ok();
  }
  Status boolean(const std::string& k, bool& out) const {
    const json* v = find(k);
    if (!v) return Status::Ok();
    if (!v->is_boolean()) return bad(k, "true or false");
    out = v->get<bool>();
    return Status::Ok();
  }
  Status string(const std::string& k, std::string& out, const std::vector<std::string>& allowed = {}) const {
    const json* v = find(k);
    if (!v) return Status::Ok();
    if (!v->is_string()) return bad(k, allowed.empty() ? "a string" : "one of " + fmt::format("{}", fmt::join(allowed, ", ")));
    std::string s = v->get<std::string>();
    if (!allowed.empty() && std::find(allowed.begin(), allowed.end(), s) == allowed.end())
      return bad(k, "one of " + fmt::format("{}", fmt::join(allowed, ", ")));
    out = s;
    return Status::Ok();
  }
  Status offload(const std::string& k, OffloadConfig& o) const {
    std::string dev = "none";
    ZOE_RETURN_IF_ERROR(string(k + ".device", dev, {"none", "cpu", "nvme"}));
    o.device = dev == "cpu" ? OffloadDevice::kCpu : dev == "nvme" ? OffloadDevice::kNvme : OffloadDevice::kNone;
    ZOE_RETURN_IF_ERROR(string(k + ".nvme_path", o.nvme_path));
    ZOE_RETURN_IF_ERROR(boolean(k + ".pin_memory", o.pin_memory));
    if (find(k + ".ratio")) ZOE_RETURN_IF_ERROR(number(k + ".ratio", o.ratio, 0.0, 1.0));
    if (o.device == OffloadDevice::kNvme && o.nvme_path.empty())
      return Status::Invalid(fmt::format("config key '{}.nvme_path': required when {}.device is \"nvme\"", k, k));
    return Status::Ok();
  }
};

Status apply_override(json& root, const std::string& spec) {
  size_t eq = spec.find('=');
  if (eq == std::string::npos || eq == 0)
    return Status::Invalid(fmt::format("--set '{}': expected key.path=value", spec));
  // A config is JSON, and JSON text is UTF-8: a string nlohmann cannot serialize would throw
  // later, from an error message or the checkpoint manifest, instead of failing here.
  try {
    (void)json(spec).dump();
  } catch (const json::type_error&) {
    return Status::Invalid(fmt::format("--set '{}': not valid UTF-8", spec));
  }
  std::string path = spec.substr(0, eq), text = spec.substr(eq + 1);
  json value = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (value.is_discarded()) value = text;  // a bare word is a string: --set zoe.device=cpu
  json* node = &root;
  size_t start = 0;
  for (;;) {
    size_t dot = path.find('.', start);
    std::string part = path.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
    if (part.empty()) return Status::Invalid(fmt::format("--set '{}': empty path component", spec));
    if (dot == std::string::npos) {
      (*node)[part] = value;
      return Status::Ok();
    }
    json& child = (*node)[part];
    if (!child.is_object()) child = json::object();
    node = &child;
    start = dot + 1;
  }
}

Status read_all(const Reader& r, Config& c) {
  ZOE_RETURN_IF_ERROR(r.integer("train_micro_batch_size_per_gpu", c.micro_batch, 1, 1 << 20));
  ZOE_RETURN_IF_ERROR(r.integer("gradient_accumulation_steps", c.grad_accum, 1, 1 << 20));
  if (r.find("train_batch_size")) {
    int64_t tb = 0;
    ZOE_RETURN_IF_ERROR(r.integer("train_batch_size", tb, 1, int64_t{1} << 40));
    c.train_batch = tb;
  }
  ZOE_RETURN_IF_ERROR(r.number("gradient_clipping", c.grad_clip, 0, 1e30, "a number >= 0"));
  bool bf16 = false, fp16 = false;
  ZOE_RETURN_IF_ERROR(r.boolean("bf16.enabled", bf16));
  ZOE_RETURN_IF_ERROR(r.boolean("fp16.enabled", fp16));
  if (bf16 && fp16) return Status::Invalid("config keys 'bf16.enabled' and 'fp16.enabled': enable at most one");
  c.dtype = bf16 ? DType::kBF16 : fp16 ? DType::kF16 : DType::kF32;
  if (r.find("data_types.grad_accum_dtype")) {
    std::string g;
    ZOE_RETURN_IF_ERROR(r.string("data_types.grad_accum_dtype", g, {"fp32", "bf16", "fp16"}));
    c.grad_accum_dtype = g == "fp32" ? DType::kF32 : g == "bf16" ? DType::kBF16 : DType::kF16;
  }
  ZOE_RETURN_IF_ERROR(r.number("fp16.loss_scale", c.static_loss_scale, 0, 1e30, "a number >= 0 (0 = dynamic)"));
  ZOE_RETURN_IF_ERROR(r.integer("fp16.initial_scale_power", c.initial_scale_power, 0, 64));
  ZOE_RETURN_IF_ERROR(r.integer("fp16.loss_scale_window", c.loss_scale_window, 1, 1 << 30));
  ZOE_RETURN_IF_ERROR(r.integer("fp16.hysteresis", c.hysteresis, 1, 1 << 30));
  ZOE_RETURN_IF_ERROR(r.number("fp16.min_loss_scale", c.min_loss_scale, 1e-30, 1e30, "a number > 0"));
  std::string opt = "AdamW";
  ZOE_RETURN_IF_ERROR(r.string("optimizer.type", opt, {"AdamW", "Adam"}));
  c.adamw = opt == "AdamW";
  if (!c.adamw) c.weight_decay = 0.0;  // torch.optim.Adam's default
  ZOE_RETURN_IF_ERROR(r.number("optimizer.params.lr", c.lr, kMinLearningRate, kMaxLearningRate,
                               "a learning rate >= 0"));
  if (const json* b = r.find("optimizer.params.betas")) {
    if (!b->is_array() || b->size() != 2 || !(*b)[0].is_number() || !(*b)[1].is_number())
      return r.bad("optimizer.params.betas", "[beta1, beta2]");
    c.beta1 = (*b)[0].get<double>();
    c.beta2 = (*b)[1].get<double>();
    if (c.beta1 < 0 || c.beta1 >= 1 || c.beta2 < 0 || c.beta2 >= 1)
      return r.bad("optimizer.params.betas", "two numbers in [0, 1)");
  }
  ZOE_RETURN_IF_ERROR(r.number("optimizer.params.eps", c.eps, 1e-30, 1, "a number in (0, 1]"));
  ZOE_RETURN_IF_ERROR(r.number("optimizer.params.weight_decay", c.weight_decay, 0, 1e30, "a number >= 0"));
  ZOE_RETURN_IF_ERROR(r.string("scheduler.type", c.scheduler, {"WarmupLR", "WarmupCosineLR"}));
  ZOE_RETURN_IF_ERROR(r.number("scheduler.params.warmup_min_lr", c.warmup_min_lr, 0, 1e30));
  c.warmup_max_lr = c.lr;
  ZOE_RETURN_IF_ERROR(r.number("scheduler.params.warmup_max_lr", c.warmup_max_lr, 0, 1e30));
  ZOE_RETURN_IF_ERROR(r.integer("scheduler.params.warmup_num_steps", c.warmup_num_steps, 1, int64_t{1} << 40));
  ZOE_RETURN_IF_ERROR(r.string("scheduler.params.warmup_type", c.warmup_type, {"log", "linear"}));
  ZOE_RETURN_IF_ERROR(r.integer("scheduler.params.total_num_steps", c.total_num_steps, 0, int64_t{1} << 40));
  ZOE_RETURN_IF_ERROR(r.number("scheduler.params.warmup_min_ratio", c.warmup_min_ratio, 0, 1));
  ZOE_RETURN_IF_ERROR(r.number("scheduler.params.cos_min_ratio", c.cos_min_ratio, 0, 1));
  if (c.scheduler == "WarmupCosineLR" && c.total_num_steps <= 0)
    return Status::Invalid("config key 'scheduler.params.total_num_steps': required (> 0) for WarmupCosineLR");
  ZOE_RETURN_IF_ERROR(r.integer("zero_optimization.stage", c.stage, 0, 3));
  constexpr int64_t kBig = int64_t{1} << 50;
  ZOE_RETURN_IF_ERROR(r.boolean("zero_optimization.overlap_comm", c.overlap_comm));
  ZOE_RETURN_IF_ERROR(r.integer("zero_optimization.reduce_bucket_size", c.reduce_bucket_size, 1, kBig));
  ZOE_RETURN_IF_ERROR(r.integer("zero_optimization.allgather_bucket_size", c.allgather_bucket_size, 1, kBig));
  ZOE_RETURN_IF_ERROR(r.integer("zero_optimization.stage3_prefetch_bucket_size", c.prefetch_bucket_size, 0, kBig));
  ZOE_RETURN_IF_ERROR(r.integer("zero_optimization.stage3_max_live_parameters", c.max_live_parameters, 0, kBig));
  ZOE_RETURN_IF_ERROR(r.integer("zero_optimization.stage3_max_reuse_distance", c.max_reuse_distance, 0, kBig));
  ZOE_RETURN_IF_ERROR(
      r.integer("zero_optimization.stage3_param_persistence_threshold", c.param_persistence_threshold, 0, kBig));
  ZOE_RETURN_IF_ERROR(r.integer("zero_optimization.sub_group_size", c.sub_group_size, 1, kBig));
  ZOE_RETURN_IF_ERROR(r.offload("zero_optimization.offload_optimizer", c.offload_optimizer));
  ZOE_RETURN_IF_ERROR(r.offload("zero_optimization.offload_param", c.offload_param));
  ZOE_RETURN_IF_ERROR(r.integer("aio.block_size", c.aio_block_size, 4096, int64_t{1} << 30));
  ZOE_RETURN_IF_ERROR(r.integer("aio.queue_depth", c.aio_queue_depth, 1, 4096));
  ZOE_RETURN_IF_ERROR(r.integer("steps_per_print", c.steps_per_print, 0, 1 << 30));
  ZOE_RETURN_IF_ERROR(r.integer("seed", c.seed, 0, INT64_MAX));
  ZOE_RETURN_IF_ERROR(r.string("zoe.device", c.device, {"cpu", "cpu-strict", "cuda"}));
  if (const json* v = r.find("zoe.device_memory_budget"); v && !(v->is_string() && v->get<std::string>() == "auto")) {
    ZOE_ASSIGN_OR_RETURN(c.device_memory_budget, parse_bytes(*v, "zoe.device_memory_budget"));
    c.device_memory_budget_auto = false;
  }
  if (const json* v = r.find("zoe.host_memory_budget")) {
    ZOE_ASSIGN_OR_RETURN(c.host_memory_budget, parse_bytes(*v, "zoe.host_memory_budget"));
  }
  ZOE_RETURN_IF_ERROR(r.string("zoe.model.type", c.model_type, {"mlp", "gpt2"}));
  ZOE_RETURN_IF_ERROR(r.integer("zoe.model.n_layer", c.n_layer, 1, 1 << 16));
  ZOE_RETURN_IF_ERROR(r.integer("zoe.model.n_head", c.n_head, 1, 1 << 16));
  ZOE_RETURN_IF_ERROR(r.integer("zoe.model.n_embd", c.n_embd, 1, 1 << 20));
  ZOE_RETURN_IF_ERROR(r.integer("zoe.model.vocab_size", c.vocab_size, 2, 1 << 24));
  ZOE_RETURN_IF_ERROR(r.integer("zoe.model.n_positions", c.n_positions, 1, 1 << 24));
  if (c.model_type == "gpt2" && c.n_embd % c.n_head != 0)
    return Status::Invalid(fmt::format("config key 'zoe.model.n_embd': {} is not a multiple of n_head = {}",
                                       c.n_embd, c.n_head));
  ZOE_RETURN_IF_ERROR(r.string("zoe.data.train", c.data_train));
  ZOE_RETURN_IF_ERROR(r.string("zoe.data.val", c.data_val));
  ZOE_RETURN_IF_ERROR(r.string("zoe.data.format", c.data_format, {"bytes", "llmc"}));
  ZOE_RETURN_IF_ERROR(r.integer("zoe.data.seq_len", c.seq_len, 1, 1 << 24));
  if (c.model_type == "gpt2" && c.seq_len > c.n_positions)
    return Status::Invalid(fmt::format("config key 'zoe.data.seq_len': {} exceeds zoe.model.n_positions = {}",
                                       c.seq_len, c.n_positions));
  ZOE_RETURN_IF_ERROR(r.integer("zoe.steps", c.steps, 0, int64_t{1} << 40));
  ZOE_RETURN_IF_ERROR(r.integer("zoe.eval_every", c.eval_every, 0, int64_t{1} << 40));
  ZOE_RETURN_IF_ERROR(r.string("zoe.init", c.init_path));
  ZOE_RETURN_IF_ERROR(r.string("zoe.checkpoint.dir", c.checkpoint_dir));
  ZOE_RETURN_IF_ERROR(r.integer("zoe.checkpoint.every", c.checkpoint_every, 0, int64_t{1} << 40));
  ZOE_RETURN_IF_ERROR(r.integer("zoe.checkpoint.keep", c.checkpoint_keep, 1, 1 << 20));
  ZOE_RETURN_IF_ERROR(r.boolean("zoe.checkpoint.verify", c.checkpoint_verify));
  ZOE_RETURN_IF_ERROR(r.boolean("zoe.activation_checkpointing", c.activation_checkpointing));
  ZOE_RETURN_IF_ERROR(r.boolean("zoe.checksums", c.checksums));
  ZOE_RETURN_IF_ERROR(r.boolean("zoe.update_in_backward", c.update_in_backward));
  ZOE_RETURN_IF_ERROR(r.boolean("zoe.allow_tf32", c.allow_tf32));
  ZOE_RETURN_IF_ERROR(r.boolean("zoe.nccl_reduce_scatter", c.nccl_reduce_scatter));
  ZOE_RETURN_IF_ERROR(r.integer("zoe.gpu", c.gpu, -1, 1 << 16));
  ZOE_RETURN_IF_ERROR(r.string("zoe.compute_dtype", c.compute_dtype, {"auto", "fp32", "bf16"}));
  if (c.compute_dtype == "bf16" && c.dtype != DType::kBF16)
    return Status::Invalid(fmt::format("config key 'zoe.compute_dtype': \"bf16\" computes on bf16 weights, but the "
                                       "training dtype is {} (set bf16.enabled: true, or compute_dtype \"auto\")",
                                       dtype_name(c.dtype)));
  if (c.compute_dtype == "bf16" && c.model_type != "gpt2")
    return Status::Invalid("config key 'zoe.compute_dtype': \"bf16\" is implemented for zoe.model.type \"gpt2\" only");
  return Status::Ok();
}

}  // namespace

const std::vector<std::string>& known_config_keys() { return kKeys; }
const std::vector<std::string>& accepted_no_effect_config_keys() { return kAcceptedNoEffect; }

Status check_learning_rate(double lr, const std::string& what) {
  if (std::isfinite(lr) && lr >= kMinLearningRate && lr <= kMaxLearningRate) return Status::Ok();
  return Status::Invalid(fmt::format("{} {} is not a learning rate: a finite number in [{}, {}], as the config key "
                                     "'optimizer.params.lr' takes", what, lr, kMinLearningRate, kMaxLearningRate));
}

Result<uint64_t> parse_bytes(const json& v, const std::string& key) {
  auto bad = [&] {
    return Status::Invalid(fmt::format("config key '{}': expected bytes, more than 0 and at most 1 EiB (e.g. 4294967296 or \"4GiB\"), got {}",
                                       key, v.dump()));
  };
  // 2^60 bytes (an exbibyte) is beyond any machine; the bound also keeps the conversion defined.
  constexpr double kMaxBytes = 1152921504606846976.0;
  if (v.is_number()) {
    double d = v.get<double>();
    if (!(d > 0) || d > kMaxBytes) return bad();
    return static_cast<uint64_t>(d);
  }
  if (!v.is_string()) return bad();
  std::string s = v.get<std::string>();
  size_t pos = 0;
  double num = 0;
  try {
    num = std::stod(s, &pos);
  } catch (...) {
    return bad();
  }
  std::string unit = s.substr(pos);
  unit.erase(std::remove(unit.begin(), unit.end(), ' '), unit.end());
  static const std::map<std::string, double> kUnits = {
      {"", 1}, {"B", 1}, {"KB", 1e3}, {"MB", 1e6}, {"GB", 1e9}, {"TB", 1e12},
      {"KiB", 1024.0}, {"MiB", 1048576.0}, {"GiB", 1073741824.0}, {"TiB", 1099511627776.0}};
  auto it = kUnits.find(unit);
  if (it == kUnits.end() || !std::isfinite(num) || !(num > 0) || !(num * it->second <= kMaxBytes)) return bad();
  return static_cast<uint64_t>(num * it->second);
}

Result<Config> parse_config(const std::string& text, const std::vector<std::string>& overrides,
                            const std::string& source) {
  json root = json::parse(text, nullptr, /*allow_exceptions=*/false, /*ignore_comments=*/true);
  if (root.is_discarded()) return Status::Invalid(fmt::format("config '{}': not valid JSON", source));
  if (!root.is_object()) return Status::Invalid(fmt::format("config '{}': expected a JSON object", source));
  for (const auto& o : overrides) ZOE_RETURN_IF_ERROR(apply_override(root, o));
  // Checked after the overrides, whose dotted paths nest too: flatten() and dump() recurse.
  if (json_deeper_than(root, kMaxJsonDepth))
    return Status::Invalid(fmt::format("config '{}': nested deeper than {} levels", source, kMaxJsonDepth));
  std::map<std::string, json> kv;
  flatten(root, "", kv);
  for (const auto& [k, v] : kv) {
    bool known = std::find(kKeys.begin(), kKeys.end(), k) != kKeys.end() ||
                 std::find(kAcceptedNoEffect.begin(), kAcceptedNoEffect.end(), k) != kAcceptedNoEffect.end();
    if (!known)
      return Status::Invalid(fmt::format("unknown config key '{}' in {} (did you mean '{}'?)", k, source, closest_key(k)));
    // DeepSpeed's "auto" (filled in by its integrations) has no meaning here, except where zoe
    // itself chooses: zoe.compute_dtype's and zoe.device_memory_budget's defaults.
    if (v.is_string() && v.get<std::string>() == "auto" && k != "zoe.compute_dtype" && k != "zoe.device_memory_budget")
      return Status::Invalid(fmt::format("config key '{}': \"auto\" is not supported, give a value", k));
  }
  Config c;
  ZOE_RETURN_IF_ERROR(read_all(Reader{kv}, c));
  return c;
}

Result<Config> load_config_file(const std::string& path, const std::vector<std::string>& overrides) {
  std::ifstream f(path);
  if (!f) return Status::Invalid(fmt::format("config file '{}': cannot be opened", path));
  constexpr size_t kMaxConfigBytes = size_t{16} << 20;  // a config is a few KiB
  std::string text;
  if (!read_at_most(f, kMaxConfigBytes, &text))
    return Status::Invalid(fmt::format("config file '{}': larger than {} bytes; not a zoe config", path, kMaxConfigBytes));
  return parse_config(text, overrides, path);
}

json config_to_json(const Config& c) {
  auto off = [](const OffloadConfig& o) {
    static const char* kNames[] = {"none", "cpu", "nvme"};
    return json{{"device", kNames[static_cast<int>(o.device)]}, {"nvme_path", o.nvme_path},
                {"pin_memory", o.pin_memory}, {"ratio", o.ratio}};
  };
  json j;
  j["train_micro_batch_size_per_gpu"] = c.micro_batch;
  j["gradient_accumulation_steps"] = c.grad_accum;
  j["gradient_clipping"] = c.grad_clip;
  j["bf16"] = {{"enabled", c.dtype == DType::kBF16}};
  if (c.grad_accum_dtype)
    j["data_types"] = {{"grad_accum_dtype", *c.grad_accum_dtype == DType::kF32    ? "fp32"
                                            : *c.grad_accum_dtype == DType::kBF16 ? "bf16"
                                                                                  : "fp16"}};
  j["fp16"] = {{"enabled", c.dtype == DType::kF16}, {"loss_scale", c.static_loss_scale},
               {"initial_scale_power", c.initial_scale_power}, {"loss_scale_window", c.loss_scale_window},
               {"hysteresis", c.hysteresis}, {"min_loss_scale", c.min_loss_scale}};
  j["optimizer"] = {{"type", c.adamw ? "AdamW" : "Adam"},
                    {"params", {{"lr", c.lr}, {"betas", {c.beta1, c.beta2}}, {"eps", c.eps},
                                {"weight_decay", c.weight_decay}}}};
  if (!c.scheduler.empty())
    j["scheduler"] = {{"type", c.scheduler},
                      {"params", {{"warmup_min_lr", c.warmup_min_lr}, {"warmup_max_lr", c.warmup_max_lr},
                                  {"warmup_num_steps", c.warmup_num_steps}, {"warmup_type", c.warmup_type},
                                  {"total_num_steps", c.total_num_steps}, {"warmup_min_ratio", c.warmup_min_ratio},
                                  {"cos_min_ratio", c.cos_min_ratio}}}};
  j["zero_optimization"] = {{"stage", c.stage}, {"offload_optimizer", off(c.offload_optimizer)},
                            {"offload_param", off(c.offload_param)}};
  j["seed"] = c.seed;
  j["steps_per_print"] = c.steps_per_print;
  j["zoe"] = {{"device", c.device},
              {"device_memory_budget", c.device_memory_budget_auto ? json("auto") : json(c.device_memory_budget)},
              {"host_memory_budget", c.host_memory_budget},
              {"model", {{"type", c.model_type}, {"n_layer", c.n_layer}, {"n_head", c.n_head}, {"n_embd", c.n_embd},
                         {"vocab_size", c.vocab_size}, {"n_positions", c.n_positions}}},
              {"data", {{"train", c.data_train}, {"val", c.data_val}, {"format", c.data_format}, {"seq_len", c.seq_len}}},
              {"steps", c.steps}, {"eval_every", c.eval_every}, {"init", c.init_path},
              {"checkpoint", {{"dir", c.checkpoint_dir}, {"every", c.checkpoint_every}, {"keep", c.checkpoint_keep},
                              {"verify", c.checkpoint_verify}}},
              {"activation_checkpointing", c.activation_checkpointing}, {"checksums", c.checksums},
              {"compute_dtype", c.compute_dtype}, {"update_in_backward", c.update_in_backward},
              {"allow_tf32", c.allow_tf32}, {"nccl_reduce_scatter", c.nccl_reduce_scatter}, {"gpu", c.gpu}};
  return j;
}

}  // namespace zoe
