#include "cuda_agent/core/progress.h"

#include <unistd.h>

#include <fmt/format.h>

namespace cuda_agent {
namespace {

std::string duration_text(double s) {
  if (s < 0 || s != s) return "?";
  const long total = static_cast<long>(s + 0.5);
  if (total >= 3600) return fmt::format("{}h{:02}m", total / 3600, (total % 3600) / 60);
  if (total >= 60) return fmt::format("{}m{:02}s", total / 60, total % 60);
  return fmt::format("{}s", total);
}

}  // namespace

bool stderr_is_terminal() { return isatty(STDERR_FILENO) != 0; }

ProgressReporter::ProgressReporter(std::ostream& out, size_t total, std::string unit, bool interactive)
    : out_(out), total_(total), unit_(std::move(unit)), tty_(interactive),
      start_(std::chrono::steady_clock::now()) {}

ProgressReporter::~ProgressReporter() {
  if (tty_ && done_ > 0) out_ << "\n" << std::flush;
}

std::string ProgressReporter::status_line(size_t done, size_t total, double elapsed_s, const std::string& unit) {
  constexpr int kWidth = 24;
  const double fraction = total ? static_cast<double>(done) / total : 1.0;
  const int filled = static_cast<int>(fraction * kWidth + 1e-9);
  const double rate_per_min = elapsed_s > 0 ? done / elapsed_s * 60.0 : 0.0;
  const double eta = done ? elapsed_s / done * (total - done) : -1;
  return fmt::format("[{}{}] {}/{} {:5.1f}% | {:.1f} {}/min | elapsed {} | ETA {}", std::string(filled, '#'),
                     std::string(kWidth - filled, '.'), done, total, 100 * fraction, rate_per_min, unit,
                     duration_text(elapsed_s), done ? duration_text(eta) : "?");
}

void ProgressReporter::step(const std::string& what) {
  std::lock_guard<std::mutex> lock(mutex_);
  ++done_;
  const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  const std::string status = status_line(done_, total_, elapsed, unit_);
  if (tty_) {
    // The finished step on its own line, the bar redrawn below it.
    out_ << "\r\033[K" << what << "\n" << status << std::flush;
  } else {
    out_ << status << "  " << what << "\n" << std::flush;
  }
}

}  // namespace cuda_agent
