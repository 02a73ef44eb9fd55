#include <algorithm>
#include <sstream>

#include <gtest/gtest.h>

#include "cuda_agent/core/progress.h"

using cuda_agent::ProgressReporter;

TEST(Progress, StatusLineShowsCountRateAndEta) {
  // 3 of 12 evaluations in 90 s: 2.0 per minute, 270 s (4m30s) to go.
  const std::string line = ProgressReporter::status_line(3, 12, 90.0, "eval");
  EXPECT_NE(line.find("3/12"), std::string::npos) << line;
  EXPECT_NE(line.find(" 25.0%"), std::string::npos) << line;
  EXPECT_NE(line.find("2.0 eval/min"), std::string::npos) << line;
  EXPECT_NE(line.find("elapsed 1m30s"), std::string::npos) << line;
  EXPECT_NE(line.find("ETA 4m30s"), std::string::npos) << line;
  EXPECT_NE(line.find("[######..................]"), std::string::npos) << line;
}

TEST(Progress, NonInteractiveOutputIsOneLinePerStep) {
  std::ostringstream out;
  {
    ProgressReporter reporter(out, 2, "eval", false);
    reporter.step("a: pass");
    reporter.step("b: mismatch");
  }
  const std::string text = out.str();
  EXPECT_EQ(std::count(text.begin(), text.end(), '\n'), 2) << text;
  EXPECT_NE(text.find("1/2"), std::string::npos);
  EXPECT_NE(text.find("2/2 100.0%"), std::string::npos) << text;
  EXPECT_NE(text.find("b: mismatch"), std::string::npos);
  EXPECT_EQ(text.find('\r'), std::string::npos) << "no carriage returns in logs";
}

TEST(Progress, InteractiveOutputRedrawsInPlace) {
  std::ostringstream out;
  {
    ProgressReporter reporter(out, 1, "eval", true);
    reporter.step("a: pass");
  }
  EXPECT_NE(out.str().find("\r\033[K"), std::string::npos);
}
