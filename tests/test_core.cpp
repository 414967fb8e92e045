#include <gtest/gtest.h>
#include "core/alloc.h"
#include "core/tensor.h"

TEST(Core, ShapeNumelAndString) {
  sat::Shape s{2, 3, 4};
  EXPECT_EQ(s.numel(), 24);
  EXPECT_EQ(s.str(), "[2, 3, 4]");
  EXPECT_EQ(s[-1], 4);
}

TEST(Core, AllocationsAreCountedAndBudgetEnforced) {
  auto before = sat::mem_stats();
  {
    sat::Buffer b(1000, "test buffer");
    EXPECT_EQ(sat::mem_stats().current, before.current + 1000);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(b.data()) % 64, 0u);
  }
  EXPECT_EQ(sat::mem_stats().current, before.current);
  sat::mem_set_budget(before.current + 100);
  EXPECT_THROW(sat::Buffer(200, "too big"), sat::OutOfMemory);
  sat::mem_set_budget(0);
}
