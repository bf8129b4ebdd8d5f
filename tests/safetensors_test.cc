// SafetensorsReader / SafetensorsWriter: round trip, every corruption case, and a cross-check
// against the Python `safetensors` package when it is installed.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "common/checksum.h"
#include "ckpt/safetensors_reader.h"
#include "ckpt/safetensors_writer.h"
#include "test_util.h"

namespace zoe {
namespace {

namespace fs = std::filesystem;
using test::slurp;

void put(const std::string& path, const std::string& bytes) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

std::string le64(uint64_t n) {
  std::string s(8, '\0');
  for (int i = 0; i < 8; ++i) s[i] = static_cast<char>(n >> (8 * i));
  return s;
}

// A JSON object of the given "name": {...} entries.
std::string obj(const std::vector<std::string>& entries) {
  std::string s = "{";
  for (size_t i = 0; i < entries.size(); ++i) {
    if (i) s.append(", ");
    s.append(entries[i]);
  }
  s.append("}");
  return s;
}

// A file with the given header text and `data_bytes` bytes of data.
std::string st_file(const std::string& header, size_t data_bytes) {
  return le64(header.size()) + header + std::string(data_bytes, '\x11');
}

class SafetensorsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = test::make_temp_dir("st");
    ASSERT_FALSE(dir_.empty());
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string p(const std::string& name) const { return dir_ + "/" + name; }

  // Writes `bytes` and expects Open to fail as Corrupt with every fragment in the message.
  void expect_corrupt(const std::string& bytes, std::vector<std::string> fragments) {
    std::string path = p("bad.safetensors");
    put(path, bytes);
    Result<SafetensorsReader> r = SafetensorsReader::Open(path);
    ASSERT_FALSE(r.ok()) << "opened: " << bytes.substr(8, 200);
    EXPECT_EQ(r.status().code(), Code::kCorrupt) << r.status().message();
    fragments.push_back(path);
    for (const auto& f : fragments)
      EXPECT_NE(r.status().message().find(f), std::string::npos)
          << "message '" << r.status().message() << "' lacks '" << f << "'";
  }

  std::string dir_;
};

TEST_F(SafetensorsTest, DTypeNames) {
  for (auto t : {StDType::kBool, StDType::kU8, StDType::kF8E4M3, StDType::kBF16, StDType::kF16,
                 StDType::kF32, StDType::kF64, StDType::kI64, StDType::kU64}) {
    auto back = st_dtype_from_name(st_dtype_name(t));
    ASSERT_TRUE(back.has_value()) << st_dtype_name(t);
    EXPECT_EQ(*back, t);
  }
  EXPECT_EQ(st_dtype_size(StDType::kBF16), 2u);
  EXPECT_EQ(st_dtype_size(StDType::kF64), 8u);
  EXPECT_EQ(st_dtype_size(StDType::kF8E5M2), 1u);
  EXPECT_FALSE(st_dtype_from_name("F33").has_value());
  EXPECT_EQ(st_dtype_of(DType::kBF16), StDType::kBF16);
  EXPECT_EQ(dtype_of(StDType::kF16), DType::kF16);
  EXPECT_FALSE(dtype_of(StDType::kI32).has_value());
}

TEST_F(SafetensorsTest, RoundTrip) {
  std::vector<float> w = test::random_floats(7 * 5, 1);
  std::vector<uint16_t> bf(9), hf(3);
  for (size_t i = 0; i < bf.size(); ++i) bf[i] = f32_to_bf16(0.1f * float(i) - 0.3f);
  for (size_t i = 0; i < hf.size(); ++i) hf[i] = f32_to_f16(1.5f * float(i) + 0.25f);
  const uint8_t bytes[3] = {0, 7, 255};
  const float scalar = 42.5f;

  SafetensorsWriter wr;
  ASSERT_TRUE(wr.add("h.0.attn.c_attn.bias", DType::kBF16, {9}, bf.data()).ok());  // 18 bytes: odd
  ASSERT_TRUE(wr.add("wte.weight", DType::kF32, {7, 5}, w.data()).ok());           // so unaligned
  ASSERT_TRUE(wr.add("half", StDType::kF16, {1, 3}, hf.data()).ok());
  ASSERT_TRUE(wr.add("flags", StDType::kU8, {3}, bytes).ok());
  ASSERT_TRUE(wr.add("empty", DType::kF32, {0, 4}, nullptr).ok());
  ASSERT_TRUE(wr.add("scalar", DType::kF32, {}, &scalar).ok());
  wr.set_metadata("format", "pt");
  wr.set_metadata("step", "1");
  wr.set_metadata("step", "2");
  std::string sum;
  ASSERT_TRUE(wr.write(p("m.safetensors"), &sum).ok());
  EXPECT_EQ(sum, checksum_file(p("m.safetensors")).value());

  std::string raw = slurp(p("m.safetensors"));
  uint64_t n = 0;
  std::memcpy(&n, raw.data(), 8);
  EXPECT_EQ(n % 8, 0u) << "header padded to a multiple of 8";
  EXPECT_EQ(raw.size(), 8 + n + 18 + 140 + 6 + 3 + 0 + 4);
  std::string header = raw.substr(8, n);
  EXPECT_EQ(header.find("{\"__metadata__\":{\"format\":\"pt\",\"step\":\"2\"},\"h.0.attn"), 0u) << header;
  EXPECT_EQ(header.find_last_not_of(' '), header.find_last_of('}'));

  Result<SafetensorsReader> r = SafetensorsReader::Open(p("m.safetensors"));
  ASSERT_TRUE(r.ok()) << r.status().message();
  const auto& ts = r->tensors();
  ASSERT_EQ(ts.size(), 6u);
  const char* order[] = {"h.0.attn.c_attn.bias", "wte.weight", "half", "flags", "empty", "scalar"};
  for (size_t i = 0; i < 6; ++i) EXPECT_EQ(ts[i].name, order[i]);
  EXPECT_EQ(r->metadata().at("format"), "pt");
  EXPECT_EQ(r->metadata().at("step"), "2");

  const StTensorInfo* t = r->find("wte.weight");
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->dtype, StDType::kF32);
  EXPECT_EQ(t->shape, (std::vector<int64_t>{7, 5}));
  EXPECT_EQ(t->numel, 35u);
  EXPECT_EQ(t->data_begin, 18u);
  EXPECT_EQ(std::memcmp(r->data(*t), w.data(), 140), 0);
  EXPECT_EQ(r->read_f32("wte.weight").value(), w);

  std::vector<float> got = r->read_f32("h.0.attn.c_attn.bias").value();
  for (size_t i = 0; i < bf.size(); ++i) EXPECT_EQ(got[i], bf16_to_f32(bf[i]));
  got = r->read_f32("half").value();
  EXPECT_EQ(got, (std::vector<float>{0.25f, 1.75f, 3.25f}));
  EXPECT_EQ(r->find("half")->shape, (std::vector<int64_t>{1, 3}));
  EXPECT_EQ(std::memcmp(r->data(*r->find("flags")), bytes, 3), 0);
  EXPECT_EQ(r->find("empty")->numel, 0u);
  EXPECT_TRUE(r->read_f32("empty").value().empty());
  EXPECT_TRUE(r->find("scalar")->shape.empty());
  EXPECT_EQ(r->read_f32("scalar").value(), std::vector<float>{42.5f});
  EXPECT_EQ(r->find("nope"), nullptr);

  Status s = r->read_f32("flags", got.data(), 3);
  EXPECT_EQ(s.code(), Code::kUnsupported);
  EXPECT_NE(s.message().find("U8"), std::string::npos);
  s = r->read_f32("half", got.data(), 4);
  EXPECT_EQ(s.code(), Code::kInvalidInput);
  EXPECT_NE(s.message().find("3 elements"), std::string::npos) << s.message();
  Result<std::vector<float>> missing = r->read_f32("lm_head.weight");
  EXPECT_EQ(missing.status().code(), Code::kInvalidInput);
  EXPECT_NE(missing.status().message().find("lm_head.weight"), std::string::npos);
  EXPECT_NE(missing.status().message().find(p("m.safetensors")), std::string::npos);
}

TEST_F(SafetensorsTest, WriterReplacesAtomicallyAndRejectsBadInput) {
  float x[2] = {1, 2};
  SafetensorsWriter a;
  ASSERT_TRUE(a.add("x", DType::kF32, {2}, x).ok());
  ASSERT_TRUE(a.write(p("f.safetensors")).ok());
  SafetensorsWriter b;
  ASSERT_TRUE(b.add("y", DType::kF32, {1}, x).ok());
  ASSERT_TRUE(b.write(p("f.safetensors")).ok());
  Result<SafetensorsReader> r = SafetensorsReader::Open(p("f.safetensors"));
  ASSERT_TRUE(r.ok());
  ASSERT_EQ(r->tensors().size(), 1u);
  EXPECT_EQ(r->tensors()[0].name, "y");
  EXPECT_EQ(std::distance(fs::directory_iterator(dir_), fs::directory_iterator()), 1);

  EXPECT_EQ(b.add("y", DType::kF32, {1}, x).code(), Code::kInvalidInput);
  EXPECT_EQ(b.add("", DType::kF32, {1}, x).code(), Code::kInvalidInput);
  EXPECT_EQ(b.add("__metadata__", DType::kF32, {1}, x).code(), Code::kInvalidInput);
  EXPECT_EQ(b.add("neg", DType::kF32, {2, -1}, x).code(), Code::kInvalidInput);
  EXPECT_EQ(b.add("null", DType::kF32, {2}, nullptr).code(), Code::kInvalidInput);
  EXPECT_EQ(b.num_tensors(), 1u);
  Status s = b.write(p("no/such/dir/f.safetensors"));
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("no/such/dir"), std::string::npos);
}

TEST_F(SafetensorsTest, OpenErrors) {
  Result<SafetensorsReader> r = SafetensorsReader::Open(p("missing.safetensors"));
  EXPECT_EQ(r.status().code(), Code::kInvalidInput);
  EXPECT_NE(r.status().message().find("missing.safetensors"), std::string::npos);
}

TEST_F(SafetensorsTest, CorruptHeaderLength) {
  expect_corrupt("", {"0 bytes", "too short"});
  expect_corrupt(std::string("\x10\x00\x00", 3), {"3 bytes"});
  expect_corrupt(le64(100) + "{}", {"header length 100", "10-byte file"});
  expect_corrupt(le64(200'000'000) + std::string(16, ' '), {"header length 200000000", "limit"});
  expect_corrupt(le64(0), {"does not start with '{'"});
}

TEST_F(SafetensorsTest, CorruptJson) {
  expect_corrupt(st_file("[1, 2, 3]", 0), {"does not start with '{'"});
  expect_corrupt(st_file("{\"a\": {\"dtype\": \"F32\"", 0), {"not valid JSON"});
  expect_corrupt(st_file("{\"a\": 1}   \x01", 0), {"not valid JSON"});
  // Error messages dump() the shape recursively: nesting is bounded first (fuzz_safetensors).
  expect_corrupt(st_file(R"({"w": {"dtype": "F32", "shape": )" + std::string(70, '[') + std::string(70, ']') +
                             R"(, "data_offsets": [0, 0]}})", 0),
                 {"deeper than 64"});
  expect_corrupt(st_file(R"({"a": 5})", 0), {"tensor 'a'", "not a JSON object"});
  expect_corrupt(st_file(R"({"__metadata__": [1]})", 0), {"__metadata__", "not a JSON object"});
  expect_corrupt(st_file(R"({"__metadata__": {"k": 1}})", 0), {"'k'", "not a string"});
  expect_corrupt(
      st_file(R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]},)"
              R"( "a": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}})", 8),
      {"tensor 'a' appears twice"});
}

TEST_F(SafetensorsTest, CorruptEntries) {
  expect_corrupt(st_file(R"({"w": {"dtype": "F33", "shape": [1], "data_offsets": [0, 4]}})", 4),
                 {"tensor 'w'", "unknown dtype 'F33'"});
  expect_corrupt(st_file(R"({"w": {"shape": [1], "data_offsets": [0, 4]}})", 4),
                 {"tensor 'w'", "dtype"});
  expect_corrupt(st_file(R"({"w": {"dtype": "F32", "data_offsets": [0, 4]}})", 4),
                 {"tensor 'w'", "shape"});
  expect_corrupt(st_file(R"({"w": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 4]}})", 4),
                 {"tensor 'w'", "negative"});
  expect_corrupt(st_file(R"({"w": {"dtype": "F32", "shape": [1.5], "data_offsets": [0, 4]}})", 4),
                 {"tensor 'w'", "non-integer"});
  expect_corrupt(st_file(R"({"w": {"dtype": "F32", "shape": [4294967296, 4294967296, 4]},)"
                         R"( "x": 0})", 0),
                 {"tensor 'w'", "overflows"});
  expect_corrupt(st_file(R"({"w": {"dtype": "F32", "shape": [1]}})", 4),
                 {"tensor 'w'", "data_offsets"});
  expect_corrupt(st_file(R"({"w": {"dtype": "F32", "shape": [1], "data_offsets": [0]}})", 4),
                 {"tensor 'w'", "data_offsets"});
  expect_corrupt(st_file(R"({"w": {"dtype": "F32", "shape": [1], "data_offsets": [4, 0]}})", 4),
                 {"tensor 'w'", "end before they begin"});
  expect_corrupt(st_file(R"({"w": {"dtype": "BF16", "shape": [2, 3], "data_offsets": [0, 24]}})", 24),
                 {"tensor 'w'", "span 24 bytes", "[2, 3] of BF16 needs 12"});
}

TEST_F(SafetensorsTest, CorruptLayout) {
  auto a = [](int begin, int end) {
    return R"("a": {"dtype": "F32", "shape": [2], "data_offsets": [)" + std::to_string(begin) +
           ", " + std::to_string(end) + "]}";
  };
  auto b = [](int begin, int end) {
    return R"("b": {"dtype": "F16", "shape": [2], "data_offsets": [)" + std::to_string(begin) +
           ", " + std::to_string(end) + "]}";
  };
  // Truncated: the last tensor runs past the end of the data.
  expect_corrupt(st_file(obj({a(0, 8), b(8, 12)}), 10),
                 {"tensor 'b'", "past the end of the 10-byte data buffer"});
  // Overlap.
  expect_corrupt(st_file(obj({a(0, 8), b(6, 10)}), 10),
                 {"tensor 'b'", "overlaps tensor 'a'"});
  // Gap.
  expect_corrupt(st_file(obj({a(0, 8), b(10, 14)}), 14),
                 {"gap of 2 bytes", "before tensor 'b'"});
  expect_corrupt(st_file(obj({b(2, 6)}), 6), {"gap of 2 bytes", "before tensor 'b'"});
  // Bytes after the last tensor.
  expect_corrupt(st_file(obj({a(0, 8)}), 11), {"3 bytes at the end"});
  // And the same tensors laid out properly open fine, in offset order.
  put(p("ok.safetensors"), st_file(obj({b(8, 12), a(0, 8)}) + "  ", 12));
  Result<SafetensorsReader> r = SafetensorsReader::Open(p("ok.safetensors"));
  ASSERT_TRUE(r.ok()) << r.status().message();
  ASSERT_EQ(r->tensors().size(), 2u);
  EXPECT_EQ(r->tensors()[0].name, "a");
  EXPECT_EQ(r->tensors()[1].name, "b");
}

TEST_F(SafetensorsTest, TruncatedWrittenFileIsCaught) {
  std::vector<float> w = test::random_floats(64, 2);
  SafetensorsWriter wr;
  ASSERT_TRUE(wr.add("a", DType::kF32, {32}, w.data()).ok());
  ASSERT_TRUE(wr.add("b", DType::kF32, {32}, w.data() + 32).ok());
  ASSERT_TRUE(wr.write(p("t.safetensors")).ok());
  std::string raw = slurp(p("t.safetensors"));
  for (size_t cut : {raw.size() - 1, raw.size() - 128, size_t{20}, size_t{7}}) {
    SCOPED_TRACE("cut to " + std::to_string(cut));
    expect_corrupt(raw.substr(0, cut), {});
  }
}

// ---- cross-check with the reference implementation (Python `safetensors`) ----------------------

// A python3 that can import safetensors.numpy, or "" (PATH first, then /usr/bin/python3).
std::string find_python() {
  for (const char* py : {"python3", "/usr/bin/python3"}) {
    std::string out;
    std::string cmd = std::string(py) + " -c 'import safetensors.numpy, numpy'";
    if (test::run_command(cmd, &out) == 0) return py;
  }
  return "";
}

TEST_F(SafetensorsTest, CrossCheckWithPythonSafetensors) {
  std::string py = find_python();
  if (py.empty())
    GTEST_SKIP() << "no python3 with the `safetensors` and `numpy` packages "
                    "(pip install safetensors numpy) - cross-check not run";
  // Python writes, C++ reads.
  std::string script = p("write.py");
  put(script,
      "import sys, numpy as np\n"
      "from safetensors.numpy import save_file\n"
      "save_file({'wte.weight': (np.arange(12, dtype=np.float32) * 0.5 - 2).reshape(3, 4),\n"
      "           'half': np.array([0.5, -1.25, 65504], dtype=np.float16),\n"
      "           'ids': np.array([[1, -2], [3, -4]], dtype=np.int32),\n"
      "           'b': np.array([7], dtype=np.uint8)},\n"
      "          sys.argv[1], metadata={'format': 'np', 'note': 'from python'})\n");
  std::string out;
  ASSERT_EQ(test::run_command(py + " " + script + " " + p("py.safetensors"), &out), 0) << out;
  Result<SafetensorsReader> r = SafetensorsReader::Open(p("py.safetensors"));
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(r->tensors().size(), 4u);
  EXPECT_EQ(r->metadata().at("note"), "from python");
  std::vector<float> w = r->read_f32("wte.weight").value();
  ASSERT_EQ(w.size(), 12u);
  for (int i = 0; i < 12; ++i) EXPECT_EQ(w[i], i * 0.5f - 2) << i;
  EXPECT_EQ(r->find("wte.weight")->shape, (std::vector<int64_t>{3, 4}));
  EXPECT_EQ(r->read_f32("half").value(), (std::vector<float>{0.5f, -1.25f, 65504.f}));
  const StTensorInfo* ids = r->find("ids");
  ASSERT_NE(ids, nullptr);
  EXPECT_EQ(ids->dtype, StDType::kI32);
  int32_t iv[4];
  std::memcpy(iv, r->data(*ids), 16);
  EXPECT_EQ(iv[1], -2);
  EXPECT_EQ(iv[3], -4);
  EXPECT_EQ(*r->data(*r->find("b")), 7);

  // C++ writes, Python loads.
  std::vector<float> f(6);
  for (int i = 0; i < 6; ++i) f[i] = 0.25f * i - 0.5f;
  std::vector<uint16_t> h = {f32_to_f16(1.0f), f32_to_f16(-3.5f)};
  int32_t i32[3] = {-1, 0, 123456};
  uint8_t u8[1] = {200};
  SafetensorsWriter wr;
  ASSERT_TRUE(wr.add("h.0.mlp.c_fc.weight", DType::kF32, {2, 3}, f.data()).ok());
  ASSERT_TRUE(wr.add("h16", DType::kF16, {2}, h.data()).ok());
  ASSERT_TRUE(wr.add("u", StDType::kU8, {1}, u8).ok());  // the I32 after it starts at offset 29
  ASSERT_TRUE(wr.add("i", StDType::kI32, {3}, i32).ok());
  wr.set_metadata("format", "pt");
  ASSERT_TRUE(wr.write(p("cc.safetensors")).ok());
  put(script,
      "import sys, numpy as np\n"
      "from safetensors.numpy import load_file\n"
      "from safetensors import safe_open\n"
      "t = load_file(sys.argv[1])\n"
      "assert sorted(t) == sorted(['h.0.mlp.c_fc.weight', 'h16', 'u', 'i']), list(t)\n"
      "w = t['h.0.mlp.c_fc.weight']\n"
      "assert w.dtype == np.float32 and w.shape == (2, 3), (w.dtype, w.shape)\n"
      "assert np.array_equal(w.ravel(), np.arange(6, dtype=np.float32) * 0.25 - 0.5), w\n"
      "assert t['h16'].dtype == np.float16 and t['h16'].tolist() == [1.0, -3.5], t['h16']\n"
      "assert t['u'].dtype == np.uint8 and t['u'].tolist() == [200]\n"
      "assert t['i'].dtype == np.int32 and t['i'].tolist() == [-1, 0, 123456], t['i']\n"
      "with safe_open(sys.argv[1], framework='numpy') as f:\n"
      "    assert f.metadata() == {'format': 'pt'}, f.metadata()\n"
      "print('python read OK')\n");
  out.clear();
  EXPECT_EQ(test::run_command(py + " " + script + " " + p("cc.safetensors"), &out), 0) << out;
  EXPECT_NE(out.find("python read OK"), std::string::npos) << out;
}

}  // namespace
}  // namespace zoe
