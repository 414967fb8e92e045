// The parsers of values users type (core/text.h): names from a fixed set, read and printed
// from one table, and sizes in bytes with every unit the flags take; the errors name the
// setting and what it takes.
#include <gtest/gtest.h>

#include <string>

#include "core/error.h"
#include "core/text.h"
#include "error_of.h"
#include "nn/models.h"
#include "train/config.h"
#include "train/schedule.h"

using sat::test::error_of;

namespace {
enum class Fruit { apple, pear, plum };
constexpr sat::Named<Fruit> kFruits[] = {{"apple", Fruit::apple}, {"pear", Fruit::pear}, {"plum", Fruit::plum}};
}  // namespace

TEST(Text, NamedValuesParseAndPrintFromOneTable) {
  EXPECT_EQ(sat::parse_named("--fruit", "pear", kFruits), Fruit::pear);
  EXPECT_STREQ(sat::name_of(Fruit::plum, kFruits), "plum");
  EXPECT_FALSE(sat::find_named("Pear", kFruits).has_value());
  EXPECT_EQ(sat::choice_list(kFruits), "apple, pear or plum");
  EXPECT_EQ(error_of([] { sat::parse_named("--fruit", "fig", kFruits); }), "--fruit: expected apple, pear or plum, got 'fig'");
  EXPECT_EQ(error_of([] { sat::check_choice("--optimizer", "adam", {"sgd", "adamw"}); }),
            "--optimizer: expected sgd or adamw, got 'adam'");
  EXPECT_NO_THROW(sat::check_choice("--optimizer", "sgd", {"sgd", "adamw"}));
  EXPECT_TRUE(sat::parse_on_off("--layout: sp", "on"));
  EXPECT_FALSE(sat::parse_on_off("--layout: sp", "off"));
  EXPECT_EQ(error_of([] { sat::parse_on_off("--layout: sp", "yes"); }), "--layout: sp: expected on or off, got 'yes'");
}

// Every enum of the engine goes through the same parser: its names round-trip, and a wrong
// one names the flag and the choices.
TEST(Text, EnginesEnumsRoundTrip) {
  for (auto p : {sat::Precision::fp32, sat::Precision::tf32, sat::Precision::bf16, sat::Precision::fp16})
    EXPECT_EQ(sat::parse_precision(sat::precision_name(p)), p);
  for (auto r : {sat::Recompute::none, sat::Recompute::selective, sat::Recompute::full})
    EXPECT_EQ(sat::parse_recompute(sat::recompute_name(r)), r);
  EXPECT_EQ(sat::parse_dist_backend("nccl"), sat::DistBackend::nccl);
  EXPECT_EQ(error_of([] { sat::parse_precision("fp8"); }), "--precision: expected fp32, tf32, bf16 or fp16, got 'fp8'");
  EXPECT_EQ(error_of([] { sat::parse_recompute("some"); }),
            "--recompute: unknown mode 'some' (expected none, selective or full)");
  EXPECT_EQ(error_of([] { sat::parse_pipe_schedule("zb"); }),
            "--pp-schedule: expected none, gpipe, 1f1b, interleaved, zb-h1 or zb-v, got 'zb'");
  EXPECT_EQ(error_of([] { sat::parse_pipe_schedule("zb", "--layout: schedule"); }),
            "--layout: schedule: expected none, gpipe, 1f1b, interleaved, zb-h1 or zb-v, got 'zb'");
}

TEST(Text, SizesInEveryUnit) {
  const size_t Ki = 1024, Mi = Ki * Ki, Gi = Mi * Ki, Ti = Gi * Ki;
  const std::pair<const char*, size_t> cases[] = {
      {"1500000000", 1500000000}, {"512B", 512},     {"4K", 4 * Ki},          {"4KiB", 4 * Ki},
      {"4KB", 4000},              {"64M", 64 * Mi},  {"64MiB", 64 * Mi},      {"64MB", 64000000},
      {"20G", 20 * Gi},           {"20GiB", 20 * Gi}, {"20GB", 20000000000},  {"1.5G", 3 * Gi / 2},
      {"2T", 2 * Ti},             {"2TiB", 2 * Ti},  {"2TB", 2000000000000},  {"0.5KiB", 512},
      {"1e3", 1000},              {"1048576T", size_t(1) << 60}};
  for (const auto& [text, bytes] : cases) EXPECT_EQ(sat::parse_size("--memory-limit", text), bytes) << text;
  for (const char* bad : {"", "lots", "20 GiB", "20gb", "20Gb", "20GiBs", "-1G", "0", "0G", "inf", "nan", "1e30TiB",
                          "1048577T", "G"}) {
    const std::string e = error_of([&] { sat::parse_size("--memory-limit", bad); });
    EXPECT_EQ(e, std::string("--memory-limit: expected a size such as 8GiB, 512MiB, 2G, 40GB or 1500000000 (a whole "
                             "number of bytes, at most 1 EiB), got '") + bad + "'") << bad;
  }
  // Half a byte is not a size (it was rounded down to 0); a budget below its minimum is refused.
  EXPECT_EQ(sat::parse_size("--memory-budget", "1.1KB"), 1100u);
  for (const char* bad : {"0.5", "1.5B", "0.0005KB"})
    EXPECT_NE(error_of([&] { sat::parse_size("--memory-budget", bad); }).find("a whole number of bytes"),
              std::string::npos) << bad;
  EXPECT_EQ(error_of([&] { sat::parse_size("--memory-budget", "64KiB", sat::kMinMemoryBytes); }),
            "--memory-budget: 64KiB is 65536 bytes, less than the 1048576 bytes it must hold at least");
  EXPECT_EQ(sat::parse_size("--memory-budget", "1MiB", sat::kMinMemoryBytes), size_t(1) << 20);
}

TEST(Text, PrintableKeepsUtf8AndEscapesTheRest) {
  EXPECT_EQ(sat::printable("plain, caf\xc3\xa9 \xe2\x82\xac"), "plain, caf\xc3\xa9 \xe2\x82\xac");  // valid UTF-8 kept
  EXPECT_EQ(sat::printable("a\x1b[31mred\x07"), "a\\x1B[31mred\\x07");            // escape, bell
  EXPECT_EQ(sat::printable("bad \xff\xc3( \xed\xa0\x80"), "bad \\xFF\\xC3( \\xED\\xA0\\x80");  // invalid, surrogate
  EXPECT_EQ(sat::printable("overlong \xc0\xaf"), "overlong \\xC0\\xAF");
  EXPECT_EQ(sat::printable(std::string("nul\0x", 5)), "nul\\x00x");
  EXPECT_EQ(sat::printable("tab\tand\nnewline\x7f"), "tab\\x09and\\x0Anewline\\x7F");
}
