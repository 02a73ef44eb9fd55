#include "cuda_agent/core/subprocess.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <future>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "cuda_agent/core/error.h"
#include "cuda_agent/core/files.h"

namespace cuda_agent {
namespace {

namespace fs = std::filesystem;

SubprocessResult run_sh(const std::string& script, SubprocessOptions options = {}) {
  options.argv = {"sh", "-c", script};
  return run_subprocess(options);
}

// True when `pid` no longer runs: gone, or a zombie waiting for its new parent (init in a
// container may not reap promptly). Waits up to 3 s for that.
bool process_gone(pid_t pid) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(3);
  const std::string stat_path = "/proc/" + std::to_string(pid) + "/stat";
  while (std::chrono::steady_clock::now() < deadline) {
    std::ifstream stat(stat_path);
    std::string line;
    if (!stat || !std::getline(stat, line)) return true;
    const auto paren = line.rfind(')');
    if (paren != std::string::npos && paren + 2 < line.size() &&
        (line[paren + 2] == 'Z' || line[paren + 2] == 'X')) {
      return true;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return false;
}

pid_t read_pid(const fs::path& file) {
  const std::string text = read_file(file);
  EXPECT_FALSE(text.empty()) << "no pid written to " << file;
  return static_cast<pid_t>(std::atoi(text.c_str()));
}

TEST(Subprocess, ExitCodes) {
  SubprocessResult zero = run_sh("exit 0");
  EXPECT_TRUE(zero.ok());
  EXPECT_EQ(zero.exit_code, 0);
  EXPECT_EQ(zero.term_signal, 0);
  EXPECT_EQ(zero.describe(), "exited with code 0");

  SubprocessResult three = run_sh("exit 3");
  EXPECT_FALSE(three.ok());
  EXPECT_EQ(three.exit_code, 3);
  EXPECT_FALSE(three.timed_out);
  EXPECT_FALSE(three.memory_exceeded);
  EXPECT_EQ(three.describe(), "exited with code 3");
}

TEST(Subprocess, SignalDeath) {
  TempDir dir;  // in case a core file is written despite ulimit
  SubprocessOptions options;
  options.cwd = dir.path().string();
  SubprocessResult result = run_sh("ulimit -c 0; kill -SEGV $$", options);
  EXPECT_FALSE(result.ok());
  EXPECT_EQ(result.term_signal, SIGSEGV);
  EXPECT_EQ(result.describe(), "killed by signal 11 (Segmentation fault)");
}

TEST(Subprocess, TimeoutKillsChildAndBackgroundGrandchild) {
  TempDir dir;
  SubprocessOptions options;
  options.timeout_s = 1.0;  // time for the shell to start and print its child's pid, loaded
  options.stdout_path = (dir.path() / "pid").string();
  const auto start = std::chrono::steady_clock::now();
  SubprocessResult result = run_sh("sleep 100 & echo $!; sleep 100", options);
  const double elapsed =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_TRUE(result.timed_out);
  EXPECT_FALSE(result.ok());
  EXPECT_EQ(result.term_signal, SIGTERM);
  EXPECT_EQ(result.describe(), "timed out after 1.0 s");
  EXPECT_GE(result.wall_s, 1.0);
  EXPECT_LT(elapsed, 6.0);  // well before the children's own end
  const pid_t grandchild = read_pid(dir.path() / "pid");
  ASSERT_GT(grandchild, 0);
  EXPECT_TRUE(process_gone(grandchild)) << "grandchild " << grandchild << " survived";
}

TEST(Subprocess, TimeoutOnPlainSleep) {
  SubprocessOptions options;
  options.argv = {"sleep", "100"};
  options.timeout_s = 0.2;
  SubprocessResult result = run_subprocess(options);
  EXPECT_TRUE(result.timed_out);
  EXPECT_LT(result.wall_s, 5.0);
}

TEST(Subprocess, SigkillAfterGraceWhenSigtermIgnored) {
  SubprocessOptions options;
  options.timeout_s = 1.0;  // time for the shell to ignore SIGTERM first, loaded
  options.kill_grace_s = 0.2;
  // The ignored disposition is inherited by sleep too, so only SIGKILL stops the group.
  SubprocessResult result = run_sh("trap '' TERM; sleep 100", options);
  EXPECT_TRUE(result.timed_out);
  EXPECT_EQ(result.term_signal, SIGKILL);
  EXPECT_LT(result.wall_s, 6.0);
}

TEST(Subprocess, LeftoverGrandchildKilledAfterNormalExit) {
  TempDir dir;
  SubprocessOptions options;
  options.stdout_path = (dir.path() / "pid").string();
  SubprocessResult result = run_sh("sleep 100 & echo $!; exit 0", options);
  EXPECT_TRUE(result.ok()) << result.describe();
  const pid_t grandchild = read_pid(dir.path() / "pid");
  ASSERT_GT(grandchild, 0);
  EXPECT_TRUE(process_gone(grandchild)) << "grandchild " << grandchild << " survived";
}

TEST(Subprocess, MemoryLimitKillsTheGroup) {
  if (std::system("command -v python3 >/dev/null 2>&1") != 0) {
    GTEST_SKIP() << "python3 not available";
  }
  SubprocessOptions options;
  options.argv = {"python3", "-c",
                  "x = bytearray(600*1024*1024); import time; time.sleep(10)"};
  options.max_rss_bytes = 200LL * 1024 * 1024;
  options.timeout_s = 30;
  options.sample_rss = false;  // a limit is watched whatever the caller asks
  SubprocessResult result = run_subprocess(options);
  EXPECT_TRUE(result.memory_exceeded) << result.describe();
  EXPECT_FALSE(result.timed_out);
  EXPECT_FALSE(result.ok());
  EXPECT_GT(result.peak_rss_bytes, options.max_rss_bytes);
  EXPECT_LT(result.wall_s, 9.0);  // stopped well before the child's own 10 s
  EXPECT_EQ(result.describe().rfind("exceeded memory limit 200.0 MiB (peak ", 0), 0u)
      << result.describe();
}

// The watched folders may grow by max_watched_bytes from what they held at the start (here 5 MB
// already): a child that writes past it is stopped, group and all; one that stays under it runs
// to its end. The candidate process runs so, its own cache folders watched.
TEST(Subprocess, DiskLimitStopsTheGroup) {
  TempDir dir("subprocess-disk-");
  write_file_atomic(dir.path() / "before.bin", std::string(5 << 20, 'x'));
  SubprocessOptions options;
  options.watched_paths = {dir.path().string()};
  options.max_watched_bytes = 20 << 20;
  options.timeout_s = 20;
  options.argv = {"sh", "-c", "head -c 15000000 /dev/zero > small.bin && sleep 1 && echo under"};
  options.cwd = dir.path().string();
  SubprocessResult under = run_subprocess(options);
  EXPECT_TRUE(under.ok()) << under.describe();
  options.argv = {"sh", "-c", "(head -c 60000000 /dev/zero > big.bin; sleep 30) & sleep 30"};
  SubprocessResult over = run_subprocess(options);
  EXPECT_TRUE(over.disk_exceeded) << over.describe();
  EXPECT_FALSE(over.ok());
  EXPECT_LT(over.wall_s, 10.0);
  EXPECT_EQ(over.describe(), "wrote more than 20.0 MiB into its folders");
}

TEST(Subprocess, PeakRssIsReported) {
  SubprocessResult result = run_sh("exit 0");
  EXPECT_GT(result.peak_rss_bytes, 0);
  // Unsampled, the group's sum is not known: the child's own peak (the kernel's, at its exit).
  SubprocessOptions unsampled;
  unsampled.sample_rss = false;
  EXPECT_GT(run_sh("exit 0", unsampled).peak_rss_bytes, 0);
}

TEST(Subprocess, CapturesStdoutAndStderrSeparately) {
  TempDir dir;
  SubprocessOptions options;
  options.stdout_path = (dir.path() / "out").string();
  options.stderr_path = (dir.path() / "err").string();
  SubprocessResult result = run_sh("echo to-out; echo to-err >&2", options);
  EXPECT_TRUE(result.ok());
  EXPECT_EQ(read_file(dir.path() / "out"), "to-out\n");
  EXPECT_EQ(read_file(dir.path() / "err"), "to-err\n");
}

TEST(Subprocess, StdoutAndStderrToOneFileInOrder) {
  TempDir dir;
  SubprocessOptions options;
  options.stdout_path = (dir.path() / "both").string();
  options.stderr_path = options.stdout_path;
  run_sh("echo one; echo two >&2; echo three; echo four >&2", options);
  EXPECT_EQ(read_file(dir.path() / "both"), "one\ntwo\nthree\nfour\n");

  // Two spellings of one file behave the same.
  options.stderr_path = (dir.path() / "." / "both").string();
  run_sh("echo a; echo b >&2; echo c", options);
  EXPECT_EQ(read_file(dir.path() / "both"), "a\nb\nc\n");
}

TEST(Subprocess, OutputFileIsTruncated) {
  TempDir dir;
  write_file_atomic(dir.path() / "out", "old content that is long\n");
  SubprocessOptions options;
  options.stdout_path = (dir.path() / "out").string();
  run_sh("echo new", options);
  EXPECT_EQ(read_file(dir.path() / "out"), "new\n");
}

TEST(Subprocess, EnvironmentSetAndUnset) {
  ::setenv("CA_TEST_UNSET_ME", "present", 1);
  ::setenv("CA_TEST_INHERITED", "inherited", 1);
  TempDir dir;
  SubprocessOptions options;
  options.stdout_path = (dir.path() / "out").string();
  options.env_set = {{"CA_TEST_SET", "hello world"}, {"CA_TEST_INHERITED", "overridden"}};
  options.env_unset = {"CA_TEST_UNSET_ME"};
  run_sh("printf '%s|%s|%s' \"$CA_TEST_SET\" \"$CA_TEST_INHERITED\" \"${CA_TEST_UNSET_ME-unset}\"",
         options);
  EXPECT_EQ(read_file(dir.path() / "out"), "hello world|overridden|unset");
  ::unsetenv("CA_TEST_UNSET_ME");
  ::unsetenv("CA_TEST_INHERITED");
}

TEST(Subprocess, WorkingDirectory) {
  TempDir dir;
  TempDir out;
  SubprocessOptions options;
  options.argv = {"pwd", "-P"};
  options.cwd = dir.path().string();
  options.stdout_path = (out.path() / "out").string();
  EXPECT_TRUE(run_subprocess(options).ok());
  EXPECT_EQ(read_file(out.path() / "out"), fs::canonical(dir.path()).string() + "\n");
}

TEST(Subprocess, NonexistentProgramThrows) {
  SubprocessOptions options;
  options.argv = {"ca-no-such-program-xyz", "arg"};
  try {
    run_subprocess(options);
    FAIL() << "expected Error";
  } catch (const Error& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("ca-no-such-program-xyz"), std::string::npos) << message;
    EXPECT_NE(message.find("No such file or directory"), std::string::npos) << message;
  }
  options.argv = {"/nonexistent/dir/program"};
  EXPECT_THROW(run_subprocess(options), Error);
}

TEST(Subprocess, NonExecutableFileThrowsWithReason) {
  TempDir dir;
  const fs::path script = dir.path() / "not-executable";
  write_file_atomic(script, "#!/bin/sh\nexit 0\n");
  ::chmod(script.c_str(), 0644);
  SubprocessOptions options;
  options.argv = {script.string()};
  try {
    run_subprocess(options);
    FAIL() << "expected Error";
  } catch (const Error& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find(script.string()), std::string::npos) << message;
    EXPECT_NE(message.find("Permission denied"), std::string::npos) << message;
  }
}

TEST(Subprocess, BadOptionsThrow) {
  EXPECT_THROW(run_subprocess(SubprocessOptions{}), Error);
  SubprocessOptions options;
  options.argv = {"true"};
  options.cwd = "/nonexistent/working/dir";
  EXPECT_THROW(run_subprocess(options), Error);
  options.cwd.clear();
  options.stdout_path = "/nonexistent/dir/out.txt";
  EXPECT_THROW(run_subprocess(options), Error);
  options.stdout_path.clear();
  options.timeout_s = -1;
  EXPECT_THROW(run_subprocess(options), Error);
}

TEST(Subprocess, ConcurrentCallsFromSeveralThreads) {
  std::vector<std::future<SubprocessResult>> results;
  for (int i = 0; i < 6; ++i) {
    results.push_back(std::async(std::launch::async, [i] {
      return run_sh("sleep 0.1; exit " + std::to_string(i));
    }));
  }
  for (int i = 0; i < 6; ++i) EXPECT_EQ(results[i].get().exit_code, i);
}

TEST(Subprocess, PassFdBecomesDescriptorThree) {
  int fds[2];
  ASSERT_EQ(::pipe2(fds, O_CLOEXEC), 0);
  SubprocessOptions options;
  options.pass_fd = fds[1];
  SubprocessResult passed = run_sh("echo hello >&3 && ! (echo x >&4) 2>/dev/null", options);
  ::close(fds[1]);
  EXPECT_TRUE(passed.ok()) << passed.describe();
  char buffer[64] = {};
  EXPECT_EQ(::read(fds[0], buffer, sizeof(buffer) - 1), 6);
  EXPECT_STREQ(buffer, "hello\n");
  ::close(fds[0]);
  EXPECT_FALSE(run_sh("(echo hello >&3) 2>/dev/null").ok()) << "without pass_fd, descriptor 3 is closed";
  options.pass_fd = 1000;
  EXPECT_THROW(run_sh("true", options), Error);
}

// A forked child runs the body in a copy of this process: it sees this process's memory, gets
// the same set-up as a started program (descriptor 3, output files, environment, stdin from
// /dev/null, no other descriptor), and exits with what the body returns.
TEST(Subprocess, ForkedChildRunsTheBodyInACopy) {
  TempDir dir("fork-");
  const fs::path out = dir.path() / "out.txt";
  int fds[2];
  ASSERT_EQ(::pipe2(fds, O_CLOEXEC), 0);
  const int stray = ::open("/dev/null", O_RDONLY);  // not close-on-exec: must still not reach the child
  ASSERT_GE(stray, 0);
  std::string in_memory = "written before the fork";
  SubprocessOptions options;
  options.argv = {"forked"};
  options.stdout_path = out.string();
  options.pass_fd = fds[1];
  options.env_set["CA_FORK_TEST"] = "yes";
  const pid_t pid = fork_subprocess(options, [&in_memory, stray] {
    const char* env = std::getenv("CA_FORK_TEST");
    char c = 0;
    const bool stdin_empty = ::read(0, &c, 1) == 0;
    const bool stray_closed = ::fcntl(stray, F_GETFD) < 0;
    std::printf("%s|%s|%d|%d\n", in_memory.c_str(), env ? env : "", stdin_empty, stray_closed);
    return ::write(3, "x", 1) == 1 ? 7 : 1;
  });
  ::close(fds[1]);
  const SubprocessResult r = watch_subprocess(pid, options);
  ::close(stray);
  EXPECT_EQ(r.exit_code, 7) << r.describe();
  EXPECT_EQ(read_file(out), "written before the fork|yes|1|1\n");
  char buffer[4] = {};
  EXPECT_EQ(::read(fds[0], buffer, sizeof(buffer)), 1);
  ::close(fds[0]);
  EXPECT_EQ(std::getenv("CA_FORK_TEST"), nullptr) << "the child's environment is its own";

  // A body that throws ends the child with 1; the limits apply as to a started program.
  options = {};
  options.argv = {"forked"};
  EXPECT_EQ(watch_subprocess(fork_subprocess(options, []() -> int { throw Error("no"); }), options).exit_code, 1);
  options.timeout_s = 0.2;
  const SubprocessResult slow = watch_subprocess(fork_subprocess(options, [] {
    ::sleep(5);
    return 0;
  }), options);
  EXPECT_TRUE(slow.timed_out) << slow.describe();
}

// A pre-started child's clock starts when the caller hands it its work: before, no timeout.
TEST(Subprocess, DeferredTimeoutCountsFromTheHandOver) {
  std::atomic<double> deferred{-1};
  SubprocessOptions options;
  options.argv = {"sh", "-c", "sleep 0.6"};
  options.timeout_s = 0.1;  // replaced by the deferred value
  options.deferred_timeout_s = &deferred;
  const SubprocessResult never_started = run_subprocess(options);
  EXPECT_TRUE(never_started.ok()) << "no timeout before the hand-over: " << never_started.describe();

  options.argv = {"sh", "-c", "sleep 5"};
  auto run = std::async(std::launch::async, [&options] { return run_subprocess(options); });
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  deferred = 0.2;
  const SubprocessResult handed = run.get();
  EXPECT_TRUE(handed.timed_out) << handed.describe();
  EXPECT_DOUBLE_EQ(handed.timeout_s, 0.2);
  EXPECT_LT(handed.wall_s, 2.0) << "the wall time counts from the hand-over";
}

// What the caller says the child spends waiting on others (clock_paused: a GPU's lock that other
// processes hold) does not count against the timeout, up to max_paused_s: always waiting, a 3 s
// child under a 1.5 s timeout finishes; with at most 1 s granted it is stopped at about 2.5 s and
// says so; never waiting, at 1.5 s. The question names the child.
TEST(Subprocess, TheClockPausesWhileTheChildWaitsOnOthersUpToTheBound) {
  TempDir dir("subprocess-pause-");
  SubprocessOptions options;
  options.timeout_s = 1.5;
  options.max_paused_s = 30;
  std::atomic<pid_t> asked{0};
  options.clock_paused = [&](pid_t child) {
    asked = child;
    return true;
  };
  const fs::path pid_file = dir.path() / "pid";
  const SubprocessResult waited = run_sh("echo $$ > " + pid_file.string() + "; sleep 3", options);
  EXPECT_TRUE(waited.ok()) << waited.describe();
  EXPECT_GE(waited.paused_s, 1.5);
  EXPECT_LE(waited.paused_s, waited.wall_s);
  EXPECT_EQ(asked.load(), read_pid(pid_file));

  options.max_paused_s = 1;
  const SubprocessResult bounded = run_sh("sleep 10", options);
  EXPECT_TRUE(bounded.timed_out) << bounded.describe();
  EXPECT_DOUBLE_EQ(bounded.paused_s, 1.0);
  EXPECT_GE(bounded.wall_s, 2.4);
  EXPECT_LT(bounded.wall_s, 5.0);
  EXPECT_EQ(bounded.describe(), "timed out after 1.5 s (not counting 1.0 s of waiting)");

  options.clock_paused = [](pid_t) { return false; };
  const SubprocessResult never = run_sh("sleep 10", options);
  EXPECT_TRUE(never.timed_out) << never.describe();
  EXPECT_EQ(never.paused_s, 0.0);
  EXPECT_LT(never.wall_s, 2.4);
}

TEST(Subprocess, DescribeFormats) {
  SubprocessResult result;
  result.memory_exceeded = true;
  result.max_rss_bytes = 1LL << 30;
  result.peak_rss_bytes = static_cast<int64_t>(1.3 * (1LL << 30));
  EXPECT_EQ(result.describe(), "exceeded memory limit 1.0 GiB (peak 1.3 GiB)");
  result = SubprocessResult{};
  result.timed_out = true;
  result.timeout_s = 5;
  EXPECT_EQ(result.describe(), "timed out after 5.0 s");
}

}  // namespace
}  // namespace cuda_agent
