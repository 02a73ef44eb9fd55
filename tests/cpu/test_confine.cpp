// OS confinement of the evaluation worker (sandbox.confine): real workers (verify --device
// cpu) running solutions that try to write outside their sandbox, reach the network, undo the
// confinement or fake a confinement failure. Each hostile solution also runs with confine: off,
// where it must succeed, so that a test cannot pass because the hack itself was broken.
#include <fcntl.h>
#include <linux/capability.h>
#include <poll.h>
#include <pwd.h>
#include <sched.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <functional>
#include <future>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <thread>

#include <gtest/gtest.h>

#include "cuda_agent/agent/episode.h"
#include "cuda_agent/core/confinement.h"
#include "cuda_agent/core/error.h"
#include "cuda_agent/core/files.h"
#include "cuda_agent/core/proc_stat.h"
#include "cuda_agent/core/subprocess.h"
#include "cuda_agent/core/syscall_filter.h"
#include "cuda_agent/sandbox/baseline_cache.h"
#include "cuda_agent/sandbox/evaluation.h"
#include "cuda_agent/sandbox/solution_processes.h"
#include "cuda_agent/sandbox/worker_confinement.h"
#include "test_util.h"

using namespace cuda_agent;
using namespace cuda_agent::sandbox;
namespace fs = std::filesystem;

namespace {

// Whether this machine lets an unprivileged process create user, mount and network namespaces
// (probed once with util-linux's unshare).
const std::string& userns_unavailable_reason() {
  static const std::string reason = [] {
    SubprocessOptions probe;
    probe.argv = {"unshare", "--user", "--map-root-user", "--net", "--mount", "true"};
    probe.timeout_s = 20;
    try {
      const SubprocessResult r = run_subprocess(probe);
      return r.ok() ? std::string() : "unprivileged user namespaces are unavailable here (unshare " + r.describe() + ")";
    } catch (const std::exception& e) {
      return std::string("cannot probe for user namespaces: ") + e.what();
    }
  }();
  return reason;
}

std::string unique_name(const std::string& stem) {
  std::random_device rd;
  return fmt::format("{}-{:08x}{:08x}", stem, rd(), rd());
}

const char* kTask =
    "import torch\nimport torch.nn as nn\n\nclass Model(nn.Module):\n    def forward(self, a, b):\n"
    "        return a + b\n\ndef get_inputs():\n    return [torch.randn(1024), torch.randn(1024)]\n\n"
    "def get_init_inputs():\n    return []\n";

// A correct solution whose module first runs `prelude` (at import, before ModelNew exists).
std::string solution_source(const std::string& prelude) {
  return "import os\nimport torch\nimport torch.nn as nn\n\n" + prelude +
         "\n\nclass ModelNew(nn.Module):\n    def forward(self, a, b):\n        return torch.add(a, b)\n";
}

std::string py_string(const std::string& text) { return nlohmann::json(text).dump(); }

// A process of this user's outside the one under test: `sleep 60` (the caller kills it).
pid_t start_sleeper() {
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::execlp("sleep", "sleep", "60", nullptr);
    ::_exit(127);
  }
  return pid;
}

class Confine : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!userns_unavailable_reason().empty()) GTEST_SKIP() << userns_unavailable_reason();
    setenv("CUDA_AGENT_BIN", CUDA_AGENT_BINARY, 1);
    setenv("CUDA_AGENT_CACHE_DIR", cache_dir().c_str(), 1);
    task_ = write("task/model.py", kTask);
  }
  std::string cache_dir() const { return (dir_.path() / "cache").string(); }
  std::string write(const std::string& name, const std::string& text) {
    const fs::path p = dir_.path() / name;
    fs::create_directories(p.parent_path());
    write_file_atomic(p, text);
    return p.string();
  }
  // verify --device cpu of a solution whose import runs `prelude`, under `confine`.
  nlohmann::json verify(const std::string& prelude, const std::string& confine) {
    const std::string solution = write(unique_name("solution") + "/model_new.py", solution_source(prelude));
    return verify_file(task_, solution, [&](EvalRequest& req) { req.options.confine = confine; });
  }
  // verify --device cpu of `solution` against `task`, with the request as `adjust` leaves it.
  nlohmann::json verify_file(const std::string& task, const std::string& solution,
                             const std::function<void(EvalRequest&)>& adjust) {
    EvalRequest req;
    req.task_path = task;
    req.solution_path = solution;
    req.mode = EvalMode::kVerify;
    req.device = "cpu";
    req.options.cache_dir = cache_dir();
    req.options.trials = 1;
    req.options.timeout_s = 120;
    adjust(req);
    return evaluate(req).to_json();
  }
  nlohmann::json verify_cli(const std::string& confine, std::vector<std::string> wrapper,
                            const std::map<std::string, std::string>& env = {});
  TempDir dir_{"confine-test-"};
  std::string task_;
};

// The source of a torch shim (put first on PYTHONPATH): the real torch, whose CUDA check first
// runs `check` (lines of a function body; `here` is the shim's folder).
std::string torch_shim(const std::string& check) {
  return "import importlib, os, sys\n"
         "here = os.path.dirname(os.path.abspath(__file__))\n"
         "sys.path[:] = [p for p in sys.path if os.path.abspath(p or '.') != here]\n"
         "del sys.modules['torch']\n"
         "real = importlib.import_module('torch')\n"
         "sys.modules['torch'] = real\n"
         "_available = real.cuda.is_available\n"
         "def _is_available():\n" +
         check +
         "    return _available()\n"
         "real.cuda.is_available = _is_available\n";
}

std::string write_prelude(const std::string& path) {
  return "with open(" + py_string(path) + ", 'w') as f:\n    f.write('written by the solution')\n";
}

void expect_confined(const nlohmann::json& r) {
  ASSERT_TRUE(r.contains("worker")) << r.dump(2);
  EXPECT_EQ(r["worker"]["confine"], "auto");
  EXPECT_EQ(r["worker"]["confined"], true) << r.dump(2);
  EXPECT_FALSE(r["worker"].contains("unconfined_reason")) << r.dump(2);
}

}  // namespace

// The candidate's private /tmp and /dev/shm hold at most 4 GiB each (or host_memory_gb, when
// less): their pages count in no process's resident memory, so the memory limit does not bound
// them; at host_memory_gb (32 GiB) each a solution could hold three times the limit.
// Who holds a lock file: flock() holders only. A POSIX or OFD lock (fcntl) does not exclude
// flock(), which every lock of the project takes, so it keeps nobody waiting; counted, it let a
// command of the agent's pass as an evaluation (its GPU memory exempt from its bound) by taking a
// read lock on a GPU's lock file, while the judges' flock() went on at once (found by an
// adversarial review, 2026-12-06).
TEST(LockHolders, AreTheFlockHoldersOnly) {
  TempDir dir("lock-holders-");
  const fs::path posix = dir.path() / "posix.lock", flocked = dir.path() / "flock.lock";
  write_file_atomic(posix, "");
  write_file_atomic(flocked, "");
  const int p = ::open(posix.c_str(), O_RDONLY | O_CLOEXEC), f = ::open(flocked.c_str(), O_RDONLY | O_CLOEXEC);
  ASSERT_GE(p, 0);
  ASSERT_GE(f, 0);
  struct flock shared {};
  shared.l_type = F_RDLCK;
  shared.l_whence = SEEK_SET;
  ASSERT_EQ(::fcntl(p, F_SETLK, &shared), 0) << "a read lock on a file opened read-only";
  ASSERT_EQ(::flock(f, LOCK_SH), 0);
  EXPECT_TRUE(lock_holders(posix).empty()) << "a POSIX lock holds nobody up";
  EXPECT_EQ(lock_holders(flocked), std::vector<pid_t>{::getpid()});
  const int other = ::open(posix.c_str(), O_RDONLY | O_CLOEXEC);
  EXPECT_EQ(::flock(other, LOCK_EX | LOCK_NB), 0) << "flock is not excluded by the POSIX lock";
  ::close(other);
  ::close(p);
  ::close(f);
}

TEST_F(Confine, TheCandidatesTmpfsAreSmallerThanTheMemoryLimit) {
  auto r = verify(
      "for _d in ('/tmp', '/dev/shm'):\n    _s = os.statvfs(_d)\n"
      "    if _s.f_blocks * _s.f_frsize > 4 << 30:\n"
      "        raise RuntimeError('%s holds %d bytes' % (_d, _s.f_blocks * _s.f_frsize))\n",
      "auto");
  EXPECT_TRUE(r["ok"].get<bool>()) << r.dump(2);
  expect_confined(r);
}

TEST_F(Confine, ACorrectSolutionPassesConfined) {
  auto r = verify("", "auto");
  EXPECT_TRUE(r["ok"].get<bool>()) << r.dump(2);
  expect_confined(r);
  auto required = verify("", "namespaces");
  EXPECT_TRUE(required["ok"].get<bool>()) << required.dump(2);
  EXPECT_EQ(required["worker"]["confined"], true);
  EXPECT_EQ(required["worker"]["confine"], "namespaces");
}

TEST_F(Confine, WritesOutsideTheSandboxFail) {
  const char* home = std::getenv("HOME");
  std::vector<std::pair<std::string, std::string>> targets = {
      {"the task's folder", (fs::path(task_).parent_path() / unique_name("planted")).string()},
      {"a folder of the test's outside the workspace", (dir_.path() / unique_name("outside")).string()},
      {"the solution's own folder (read-only: only the cache and /tmp are for writing)", ""},
  };
  if (home && *home && fs::is_directory(home)) targets.push_back({"$HOME", (fs::path(home) / unique_name(".cuda-agent-confine-test")).string()});
  for (auto& [what, path] : targets) {
    SCOPED_TRACE(what);
    std::string prelude;
    if (path.empty()) {
      prelude = "with open(os.path.join(os.path.dirname(__file__), 'planted.txt'), 'w') as f:\n    f.write('x')\n";
    } else {
      prelude = write_prelude(path);
    }
    auto r = verify(prelude, "auto");
    expect_confined(r);
    EXPECT_FALSE(r["ok"].get<bool>()) << r.dump(2);
    EXPECT_EQ(r["category"], "load_error") << r.dump(2);
    EXPECT_NE(r["message"].get<std::string>().find("Read-only file system"), std::string::npos) << r["message"];
    if (!path.empty()) {
      EXPECT_FALSE(fs::exists(path)) << path;
      std::error_code ec;
      fs::remove(path, ec);
    }
  }
}

TEST_F(Confine, OffLetsTheSameWriteThrough) {
  const std::string path = (dir_.path() / unique_name("outside")).string();
  auto r = verify(write_prelude(path), "off");
  EXPECT_TRUE(r["ok"].get<bool>()) << r.dump(2);
  EXPECT_TRUE(fs::exists(path)) << "the hostile write itself is broken, so the confined tests prove nothing";
  EXPECT_EQ(r["worker"]["confined"], false);
  EXPECT_EQ(r["worker"]["confine"], "off");
  EXPECT_EQ(r["worker"]["unconfined_reason"], "sandbox.confine is off");
}

// The candidate writes its own NVRTC cache folder and its private /tmp, nothing else of the
// cache: not the baselines (only the judge writes those), and it cannot even read the key the
// baselines are authenticated with.
TEST_F(Confine, OnlyTheSolutionsOwnCacheIsWritableAndTheSecretIsHidden) {
  const std::string baseline = (fs::path(cache_dir()) / "baselines" / unique_name("forged")).string();
  const std::string scratch = "/tmp/" + unique_name("cuda-agent-confine-scratch");
  fs::create_directories(fs::path(cache_dir()) / "baselines");
  const std::string prelude =
      "import cuda_agent, tempfile\n"
      "mine = [p for p in __import__('glob').glob(" + py_string(cache_dir() + "/nvrtc/solutions/*") + ")]\n"
      "assert len(mine) == 1, mine\n"
      "with open(os.path.join(mine[0], 'probe'), 'w') as f:\n    f.write('x')\n"
      "try:\n"
      "    open(" + py_string(baseline) + ", 'w').write('{}')\n"
      "    raise RuntimeError('the baselines folder is writable')\n"
      "except OSError:\n"
      "    pass\n"
      "assert os.listdir(" + py_string(cache_dir() + "/secret") + ") == [], 'the secret is visible'\n" +
      write_prelude(scratch) +
      "with tempfile.TemporaryFile() as f:\n    f.write(b'x')\n"
      "with open('/dev/null', 'w') as f:\n    f.write('x')\n"
      "with open('/dev/shm/' + " + py_string(unique_name("shm")) + ", 'w') as f:\n    f.write('x')\n"
      "assert len(os.urandom(16)) == 16 and len(open('/dev/urandom', 'rb').read(16)) == 16\n"
      "assert open(" + py_string(scratch) + ").read() == 'written by the solution'\n";
  (void)cache_secret(cache_dir());  // the key exists, as after any profiled evaluation
  auto r = verify(prelude, "auto");
  EXPECT_TRUE(r["ok"].get<bool>()) << r.dump(2);
  expect_confined(r);
  EXPECT_FALSE(fs::exists(baseline));
  EXPECT_TRUE(fs::exists(fs::path(cache_dir()) / "secret" / "key")) << "the key is still there, hidden";
  EXPECT_FALSE(fs::exists(scratch)) << "the candidate's /tmp must be private";
}

// torch.compile's inductor caches in /tmp/torchinductor_<user> by default, which the host has
// after any unconfined torch.compile run and the worker's private /tmp shows read-only: the
// worker's caches go to a fresh folder of its own instead (private_cache_env()). Without that,
// every torch.compile baseline failed on a host where torch.compile had run once.
TEST_F(Confine, TorchCompileRunsWhenTheHostHasItsDefaultCache) {
  // The default folder as the worker's Python computes it: tempfile.gettempdir() is /tmp there,
  // and getpass.getuser() reads LOGNAME, USER, LNAME, USERNAME, then the password database.
  std::string user;
  for (const char* name : {"LOGNAME", "USER", "LNAME", "USERNAME"})
    if (user.empty() && std::getenv(name) && *std::getenv(name)) user = std::getenv(name);
  if (user.empty()) {
    const passwd* pw = ::getpwuid(::getuid());
    ASSERT_NE(pw, nullptr);
    user = pw->pw_name;
  }
  const std::string host_default = "/tmp/torchinductor_" + user;
  std::error_code ec;
  fs::create_directories(host_default, ec);  // as any torch.compile run on the host leaves it
  ASSERT_TRUE(fs::is_directory(host_default)) << host_default;
  // The verdict is not the point (torch.compile leaves threads behind, which the sandbox flags):
  // the compiled function's result, written to the cache folder, is.
  // Written into the solution's own cache folder, the one place of the cache it may write.
  const std::string name = unique_name("compiled");
  const std::string prelude = "import glob, torch\n"
                              "_f = torch.compile(lambda x: x * 2 + 1)\n"
                              "_ok = torch.equal(_f(torch.ones(4)), torch.full((4,), 3.0))\n"
                              "_own = glob.glob(" + py_string(cache_dir() + "/nvrtc/solutions/*") + ")[0]\n"
                              "with open(os.path.join(_own, " + py_string(name) + "), 'w') as f:\n"
                              "    f.write(os.environ['TORCHINDUCTOR_CACHE_DIR'] + ' ' + str(_ok))\n";
  const auto r = verify(prelude, "namespaces");
  EXPECT_EQ(r["worker"]["confined"], true) << r.dump(2);
  std::string probe = "(not written)";
  for (const auto& e : fs::recursive_directory_iterator(fs::path(cache_dir()) / "nvrtc"))
    if (e.path().filename() == name) probe = e.path().string();
  ASSERT_TRUE(fs::exists(probe)) << "torch.compile failed in the confined worker: " << r.value("message", "");
  const std::string written = read_file(probe);
  EXPECT_EQ(written.rfind("/tmp/cuda-agent-caches-", 0), 0u) << written;
  EXPECT_EQ(written.substr(written.size() - 5), " True") << written;
}

TEST_F(Confine, NoNetwork) {
  // A listener outside the sandbox, on the loopback.
  const cuda_agent::testing::LoopbackListener listener = cuda_agent::testing::listen_on_loopback();
  ASSERT_GE(listener.fd.get(), 0);
  const int port = listener.port;
  const std::string prelude = fmt::format(
      "import socket\ns = socket.create_connection(('127.0.0.1', {}), timeout=10)\ns.sendall(b'escaped')\ns.close()\n",
      port);
  auto pending = [&] {
    pollfd p{listener.fd.get(), POLLIN, 0};
    return ::poll(&p, 1, 0) > 0;
  };

  auto r = verify(prelude, "auto");
  expect_confined(r);
  EXPECT_EQ(r["category"], "load_error") << r.dump(2);
  EXPECT_NE(r["message"].get<std::string>().find("Network is unreachable"), std::string::npos) << r["message"];
  EXPECT_FALSE(pending()) << "a confined solution reached a listener outside";

  auto off = verify(prelude, "off");
  EXPECT_TRUE(off["ok"].get<bool>()) << off.dump(2);
  EXPECT_TRUE(pending()) << "the connection itself is broken, so the confined run proves nothing";
}

// Root inside its namespace or not, the solution holds no capability: it cannot remount or
// unmount, and a user namespace of its own sees every mount locked read-only.
TEST_F(Confine, TheSolutionHoldsNoCapability) {
  const std::string folder = dir_.path().string();
  const std::string prelude =
      "import ctypes\n"
      "status = open('/proc/self/status').read()\n"
      "assert 'CapEff:\\t0000000000000000' in status, status\n"
      "assert 'CapBnd:\\t0000000000000000' in status, status\n"
      "assert 'NoNewPrivs:\\t1' in status, status\n"
      "libc = ctypes.CDLL(None, use_errno=True)\n"
      "MS_REMOUNT, MS_BIND, MNT_DETACH = 32, 4096, 2\n"
      "assert libc.mount(None, b'/', None, MS_REMOUNT | MS_BIND, None) != 0\n"
      "assert libc.mount(None, " + py_string(folder) + ".encode(), None, MS_REMOUNT | MS_BIND, None) != 0\n"
      "assert libc.umount2(b'/tmp', MNT_DETACH) != 0\n"
      "assert libc.umount2(b'/dev', MNT_DETACH) != 0\n";
  auto r = verify(prelude, "auto");
  expect_confined(r);
  EXPECT_TRUE(r["ok"].get<bool>()) << r.dump(2);
}

// Ways around read-only mounts: a user and mount namespace of the solution's own that remounts
// the folder writable, and the root of processes outside (the test, init) through /proc.
TEST_F(Confine, TheSolutionCannotEscapeTheMounts) {
  const std::string target = (dir_.path() / unique_name("escaped")).string();
  const std::string prelude =
      "import subprocess\n"
      "script = 'mount -o remount,bind,rw ' + " + py_string(dir_.path().string()) + " + ' 2>/dev/null; echo x > ' + " +
      py_string(target + ".ns") + "\n"
      "subprocess.run(['unshare', '--user', '--map-root-user', '--mount', 'sh', '-c', script])\n"
      "for pid in (os.getppid(), 1):\n"
      "    try:\n"
      "        with open('/proc/%d/root' % pid + " + py_string(target + ".proc") + ", 'w') as f:\n"
      "            f.write('x')\n"
      "    except OSError:\n"
      "        pass\n";
  auto r = verify(prelude, "auto");
  expect_confined(r);
  EXPECT_TRUE(r["ok"].get<bool>()) << r.dump(2);
  EXPECT_FALSE(fs::exists(target + ".ns")) << "a user namespace of the solution's own made a mount writable";
  EXPECT_FALSE(fs::exists(target + ".proc")) << "the solution wrote through /proc/<pid>/root";

  auto off = verify(prelude, "off");
  EXPECT_TRUE(off["ok"].get<bool>()) << off.dump(2);
  EXPECT_TRUE(fs::exists(target + ".ns") && fs::exists(target + ".proc"))
      << "the escapes themselves are broken, so the confined run proves nothing";
}

// /proc stays writable for the process's own files (the CUDA driver needs it), while the kernel's
// settings under it are read-only: a write of /proc/sys fails with EROFS, as root too.
TEST_F(Confine, KernelSettingsUnderProcAreReadOnly) {
  const std::string prelude =
      "import errno\n"
      "for setting in ('/proc/sys/kernel/hostname', '/proc/sys/vm/drop_caches'):\n"
      "    try:\n"
      "        with open(setting, 'w') as f:\n"
      "            f.write(open(setting).read() if setting.endswith('hostname') else '0')\n"
      "    except OSError as e:\n"
      "        if e.errno != errno.EROFS:\n"
      "            raise RuntimeError('%s: %s, not EROFS' % (setting, e))\n"
      "    else:\n"
      "        raise RuntimeError('wrote the kernel setting ' + setting)\n"
      "with open('/proc/self/comm', 'w') as f:\n"
      "    f.write('confined')\n";
  auto r = verify(prelude, "auto");
  expect_confined(r);
  EXPECT_TRUE(r["ok"].get<bool>()) << r.dump(2);
}

// A confinement failure before the solution ran is retried unconfined; nothing the solution does
// later may look like one. This solution forges a well-formed "failed in phase confine" frame of
// the judge's channel (without the channel's key: it cannot know it) on every descriptor it can
// reach, writes "result.json" files where it can, and crashes.
TEST_F(Confine, TheSolutionCannotFakeAConfinementFailure) {
  const std::string prelude =
      "import glob, json, signal, struct\n"
      "body = json.dumps({'op': 'failed', 'phase': 'confine', 'category': 'infrastructure_error',\n"
      "                   'message': 'forged'}).encode()\n"
      "frame = struct.pack('<4sQI32s', b'CAF1', 3, len(body), bytes(32)) + body\n"
      "for fd in range(3, 256):\n"
      "    try:\n"
      "        os.write(fd, frame)\n"
      "    except OSError:\n"
      "        pass\n"
      "for p in glob.glob('/proc/%d/fd/*' % os.getppid()) + glob.glob('/tmp/cuda-agent-eval-*/result.json'):\n"
      "    try:\n"
      "        with open(p, 'wb') as f:\n"
      "            f.write(frame)\n"
      "    except OSError:\n"
      "        pass\n"
      "os.kill(os.getpid(), signal.SIGSEGV)\n";
  auto r = verify(prelude, "auto");
  expect_confined(r);
  EXPECT_FALSE(r["ok"].get<bool>()) << r.dump(2);
  const std::string category = r.value("category", "");
  EXPECT_TRUE(category == "crash" || category == "tampering") << r.dump(2);
  auto after = verify("", "auto");
  EXPECT_TRUE(after["ok"].get<bool>()) << after.dump(2);
  expect_confined(after);
}

// `cuda-agent verify --json` of a plain solution in a child process (the "unconfinable" memory
// of auto is per process), with `wrapper` in front of the binary and `env` added.
nlohmann::json Confine::verify_cli(const std::string& confine, std::vector<std::string> wrapper,
                                   const std::map<std::string, std::string>& env) {
  const std::string solution = write(unique_name("plain") + "/model_new.py", solution_source(""));
  SubprocessOptions sp;
  sp.argv = std::move(wrapper);
  for (const std::string& arg : {std::string(CUDA_AGENT_BINARY), std::string("verify"), std::string("--task"), task_,
                                 std::string("--solution"), solution, std::string("--device"), std::string("cpu"),
                                 std::string("--json"), std::string("--set"), std::string("sandbox.trials=1"),
                                 std::string("--set"), "sandbox.confine=" + confine})
    sp.argv.push_back(arg);
  sp.env_set = env;
  sp.stdout_path = (dir_.path() / "cli.out").string();
  sp.stderr_path = (dir_.path() / "cli.err").string();
  sp.timeout_s = 180;
  const SubprocessResult run = run_subprocess(sp);
  const std::string out = read_file(sp.stdout_path);
  EXPECT_FALSE(run.timed_out);
  try {
    return nlohmann::json::parse(out);
  } catch (const std::exception&) {
    ADD_FAILURE() << "no JSON from the CLI (" << run.describe() << "): " << out << read_file(sp.stderr_path);
    return {{"worker", nlohmann::json::object()}};
  }
}

// A process of this user's that is not the solution's: a judge of another evaluation, say.
class Bystander {
 public:
  Bystander() {
    pid_ = ::fork();
    if (pid_ == 0) {
      ::pause();
      ::_exit(0);
    }
  }
  ~Bystander() {
    if (alive()) ::kill(pid_, SIGKILL);
    if (!reaped_) ::waitpid(pid_, nullptr, 0);
  }
  pid_t pid() const { return pid_; }
  bool alive() {
    if (reaped_) return false;
    int status = 0;
    if (::waitpid(pid_, &status, WNOHANG) == 0) return true;
    reaped_ = true;
    return false;
  }

 private:
  pid_t pid_ = -1;
  bool reaped_ = false;
};

// An evaluation's judges and the other evaluations of a bench or a training step's group run as
// the same user as the candidate: killing them lowers the rewards of the solutions beside it, and
// with group-relative advantages that raises its own. The candidate's signals are scoped to
// itself and what it starts (Landlock); its own children stay reachable. With confine: off the
// same solution kills the bystander, so the test cannot pass because the hack was broken.
TEST_F(Confine, TheSolutionCannotSignalProcessesOutsideItsOwn) {
  const std::string unavailable = signal_scope_unavailable();
  if (!unavailable.empty()) GTEST_SKIP() << "signals cannot be scoped on this kernel: " << unavailable;
  for (const std::string confine : {"auto", "off"}) {
    Bystander bystander;
    const std::string prelude = fmt::format(
        "import signal, subprocess\n"
        "outcome = []\n"
        "for pid, sig in (({}, signal.SIGKILL), (os.getppid(), 0)):\n"
        "    try:\n"
        "        os.kill(pid, sig)\n"
        "        outcome.append('sent')\n"
        "    except PermissionError:\n"
        "        outcome.append('refused')\n"
        "child = subprocess.Popen(['sleep', '30'])\n"
        "child.kill()\n"
        "assert child.wait() == -signal.SIGKILL, 'own child not killed'\n"
        "assert outcome == ['refused', 'refused'], 'signals outside: %s' % outcome\n",
        bystander.pid());
    const nlohmann::json r = verify(prelude, confine);
    if (confine == "auto") {
      EXPECT_TRUE(r.value("ok", false)) << r.dump(2);
      EXPECT_EQ(r["worker"].value("signals_scoped", false), true) << r.dump(2);
      EXPECT_TRUE(bystander.alive()) << "the confined solution killed a process outside its own";
    } else {
      EXPECT_FALSE(r.value("ok", true)) << r.dump(2);
      EXPECT_NE(r.value("message", "").find("signals outside: ['sent', 'sent']"), std::string::npos) << r.dump(2);
      EXPECT_EQ(r["worker"].value("signals_scoped", true), false);
      EXPECT_EQ(r["worker"].value("signals_unscoped_reason", ""), "sandbox.confine is off");
      for (int i = 0; i < 100 && bystander.alive(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
      EXPECT_FALSE(bystander.alive()) << "with confine: off the hack should have killed the bystander";
    }
  }
}

// The agent's Bash: `confined-exec` (the binary's namespaces) and `confined-exec --signals-only`
// (inside bubblewrap) both scope the command's signals; a plain shell does not.
TEST_F(Confine, TheAgentsConfinedCommandsCannotSignalProcessesOutsideTheirOwn) {
  const std::string unavailable = signal_scope_unavailable();
  if (!unavailable.empty()) GTEST_SKIP() << "signals cannot be scoped on this kernel: " << unavailable;
  const std::vector<std::vector<std::string>> wrappers = {
      {CUDA_AGENT_BINARY, "confined-exec", "--writable", dir_.path().string()},
      {CUDA_AGENT_BINARY, "confined-exec", "--signals-only"},
      {}};
  for (const auto& wrapper : wrappers) {
    Bystander bystander;
    SubprocessOptions sp;
    sp.argv = wrapper;
    for (const std::string& a : {std::string("bash"), std::string("-c"),
                                 fmt::format("sleep 30 & kill $! && wait $!; echo own=$?; kill -KILL {}; echo other=$?",
                                             bystander.pid())})
      sp.argv.push_back(a);
    sp.timeout_s = 60;
    sp.stdout_path = (dir_.path() / unique_name("out")).string();
    sp.stderr_path = sp.stdout_path;
    const SubprocessResult run = run_subprocess(sp);
    const std::string out = read_file(sp.stdout_path);
    const std::string what = (wrapper.empty() ? "bash" : wrapper.back()) + ": " + run.describe() + ": " + out;
    EXPECT_NE(out.find("own=143"), std::string::npos) << what;
    if (wrapper.empty()) {
      EXPECT_NE(out.find("other=0"), std::string::npos) << what;
      for (int i = 0; i < 100 && bystander.alive(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
      EXPECT_FALSE(bystander.alive()) << "a plain shell should have killed the bystander";
    } else {
      EXPECT_NE(out.find("other=1"), std::string::npos) << what;
      EXPECT_TRUE(bystander.alive()) << what << " let the command kill a process outside its own";
    }
  }
}

namespace {

// What a command under `wrapper` (none: a plain shell) left behind: it starts a daemon that leaves
// its session (setsid, so the tool's group kill misses it), waits for its pid file, runs `then`
// and exits 3. `alive`: whether the daemon still ran after the command (waited for up to a second
// to end, under a wrapper).
struct DaemonRun {
  SubprocessResult run;
  std::string out;
  pid_t daemon = 0;
  bool alive = false;
};

DaemonRun run_leaving_a_daemon(const std::vector<std::string>& wrapper, const fs::path& dir, const std::string& then) {
  const fs::path pid_file = dir / unique_name("daemon");
  SubprocessOptions sp;
  sp.argv = wrapper;
  for (const std::string& a : {std::string("bash"), std::string("-c"),
                               "setsid bash -c 'echo $$ > " + pid_file.string() +
                                   "; exec sleep 300' < /dev/null > /dev/null 2>&1 & "
                                   "for i in $(seq 100); do [ -s " +
                                   pid_file.string() + " ] && break; sleep 0.05; done; " + then + "; exit 3"})
    sp.argv.push_back(a);
  sp.timeout_s = 60;
  sp.stdout_path = (dir / unique_name("out")).string();
  DaemonRun d;
  d.run = run_subprocess(sp);
  d.out = fs::exists(sp.stdout_path) ? read_file(sp.stdout_path) : "";
  if (!fs::exists(pid_file)) return d;
  d.daemon = static_cast<pid_t>(std::stol(read_file(pid_file)));
  d.alive = ::kill(d.daemon, 0) == 0;
  for (int i = 0; i < 100 && d.alive && !wrapper.empty(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    d.alive = ::kill(d.daemon, 0) == 0;
  }
  return d;
}

}  // namespace

// A command of the agent's Bash that leaves a daemon behind: `confined-exec` stays as the
// command's subreaper and ends it with the command; a plain shell lets it live on (into the
// episode's scoring and beyond).
TEST_F(Confine, NothingTheAgentsConfinedCommandStartsOutlivesIt) {
  const std::vector<std::vector<std::string>> wrappers = {
      {CUDA_AGENT_BINARY, "confined-exec", "--writable", dir_.path().string()},
      {CUDA_AGENT_BINARY, "confined-exec", "--signals-only"},
      {}};
  for (const auto& wrapper : wrappers) {
    const std::string what = wrapper.empty() ? "bash" : wrapper.back();
    const DaemonRun d = run_leaving_a_daemon(wrapper, dir_.path(), "true");
    EXPECT_EQ(d.run.exit_code, 3) << what << ": " << d.run.describe();
    ASSERT_NE(d.daemon, 0) << what << ": the daemon wrote no pid";
    if (wrapper.empty()) {
      EXPECT_TRUE(d.alive) << "the daemon of a plain shell should have lived on";
    } else {
      EXPECT_FALSE(d.alive) << what << " left the command's daemon " << d.daemon << " running";
    }
    if (d.alive) ::kill(d.daemon, SIGKILL);
  }
}

// The same daemon from a command that then kills its wrapper (`kill -9 $PPID`), which would leave
// the daemon without the subreaper that ends it: the command's signals are scoped apart from the
// wrapper, so the kill fails (EPERM) and the daemon ends with the command. Where the kernel cannot
// scope signals there is nothing to test.
TEST_F(Confine, TheAgentsConfinedCommandCannotKillItsSupervisor) {
  const std::string unavailable = signal_scope_unavailable();
  if (!unavailable.empty()) GTEST_SKIP() << "signals cannot be scoped here: " << unavailable;
  const std::vector<std::vector<std::string>> wrappers = {
      {CUDA_AGENT_BINARY, "confined-exec", "--writable", dir_.path().string()},
      {CUDA_AGENT_BINARY, "confined-exec", "--signals-only"}};
  for (const auto& wrapper : wrappers) {
    const std::string what = wrapper[2];
    const DaemonRun d = run_leaving_a_daemon(wrapper, dir_.path(), "kill -9 $PPID 2>/dev/null; echo \"kill=$?\"");
    EXPECT_EQ(d.run.exit_code, 3) << what << ": the command ended its wrapper: " << d.run.describe();
    EXPECT_NE(d.out.find("kill=1"), std::string::npos) << what << ": " << d.out;
    ASSERT_NE(d.daemon, 0) << what << ": the daemon wrote no pid";
    EXPECT_FALSE(d.alive) << what << " left the command's daemon " << d.daemon << " running";
    if (d.alive) ::kill(d.daemon, SIGKILL);
  }
}

// Nor can it end or slow a process it cannot signal by other means: an RLIMIT_CPU of one second
// set on its supervisor, the trainer or another episode's evaluation would end it with a SIGKILL
// (`prlimit --pid`), and its own limits and priority still work (`ulimit`, `nice`). In both
// implementations, with or without the signal scope.
TEST_F(Confine, TheAgentsConfinedCommandCannotLimitOtherProcesses) {
  const pid_t outside = start_sleeper();
  ASSERT_GT(outside, 0);
  const std::string limits = "/proc/" + std::to_string(outside) + "/limits";
  const std::string before = read_file(limits);
  const std::vector<std::vector<std::string>> wrappers = {
      {CUDA_AGENT_BINARY, "confined-exec", "--writable", dir_.path().string()},
      {CUDA_AGENT_BINARY, "confined-exec", "--signals-only"},
      {}};
  for (const auto& wrapper : wrappers) {
    const std::string what = wrapper.empty() ? "bash" : wrapper.back();
    SubprocessOptions sp;
    sp.argv = wrapper;
    const std::string pid = std::to_string(outside);
    // Its wrapper too (unwrapped, that would be this test).
    const std::string parent = wrapper.empty() ? "" : "prlimit --pid $PPID --cpu=1:1 2>/dev/null; echo \"parent=$?\"; ";
    for (const std::string& a : {std::string("bash"), std::string("-c"),
                                 "prlimit --pid " + pid + " --cpu=1:1 2>/dev/null; echo \"other=$?\"; " + parent +
                                     "prlimit --cpu=1000:1000 nice -n 3 bash -c 'ulimit -t'; echo \"own=$?\""})
      sp.argv.push_back(a);
    sp.timeout_s = 60;
    sp.stdout_path = (dir_.path() / unique_name("out")).string();
    const SubprocessResult run = run_subprocess(sp);
    const std::string out = fs::exists(sp.stdout_path) ? read_file(sp.stdout_path) : "";
    EXPECT_EQ(run.exit_code, 0) << what << ": " << run.describe();
    EXPECT_NE(out.find("1000\nown=0"), std::string::npos) << what << ": its own limit: " << out;
    if (wrapper.empty()) {
      // The control: an unconfined command can (and did: the limit is undone below).
      EXPECT_NE(out.find("other=0"), std::string::npos) << out;
      continue;
    }
    EXPECT_NE(out.find("other=1"), std::string::npos) << what << ": " << out;
    EXPECT_NE(out.find("parent=1"), std::string::npos) << what << ": " << out;
    EXPECT_EQ(read_file(limits), before) << what << " changed the limits of a process outside it";
  }
  ::kill(outside, SIGKILL);
  ::waitpid(outside, nullptr, 0);
}

// A machine without user namespaces, made by running the CLI in a namespace whose
// user.max_user_namespaces is 0: namespaces is a clear error, auto runs unconfined and says why.
TEST_F(Confine, WithoutUserNamespacesAutoRunsUnconfinedAndNamespacesIsAnError) {
  const std::vector<std::string> no_userns = {"unshare", "--user", "--map-root-user", "sh", "-c",
                                              "echo 0 > /proc/sys/user/max_user_namespaces && exec \"$@\"", "sh"};
  auto required = verify_cli("namespaces", no_userns);
  EXPECT_FALSE(required.value("ok", true)) << required.dump(2);
  EXPECT_EQ(required.value("category", ""), "infrastructure_error") << required.dump(2);
  const std::string message = required.value("message", "");
  EXPECT_NE(message.find("sandbox.confine is 'namespaces'"), std::string::npos) << message;
  EXPECT_NE(message.find("cannot set up the namespaces"), std::string::npos) << message;
  EXPECT_NE(message.find("unshare"), std::string::npos) << message;
  EXPECT_EQ(required["worker"].value("confined", true), false);

  auto fallback = verify_cli("auto", no_userns);
  EXPECT_TRUE(fallback.value("ok", false)) << fallback.dump(2);
  EXPECT_EQ(fallback["worker"].value("confined", true), false);
  EXPECT_NE(fallback["worker"].value("unconfined_reason", "").find("cannot set up the namespaces"), std::string::npos)
      << fallback.dump(2);
}

// What a GPU host whose CUDA does not start inside the namespaces looks like, on the CPU: torch
// whose CUDA check works only where it can write beside itself (a shim first on PYTHONPATH). The
// candidate process is a copy of the judge, which imported torch unconfined; the check fails in
// its start-up ("init"), before the task or the solution is loaded, so auto runs the evaluation
// again with a candidate process started unconfined.
TEST_F(Confine, AStartUpThatFailsOnlyInsideTheNamespacesIsRetriedUnconfined) {
  write("shim/torch.py", torch_shim("    try:\n"
                                     "        open(os.path.join(here, 'probe'), 'w').close()\n"
                                     "    except OSError as e:\n"
                                     "        raise RuntimeError('simulated start-up failure: %s' % e)\n"));
  const std::map<std::string, std::string> env = {{"PYTHONPATH", (dir_.path() / "shim").string()}};
  auto fallback = verify_cli("auto", {}, env);
  EXPECT_TRUE(fallback.value("ok", false)) << fallback.dump(2);
  EXPECT_EQ(fallback["worker"].value("confined", true), false);
  const std::string reason = fallback["worker"].value("unconfined_reason", "");
  EXPECT_NE(reason.find("CUDA unavailable inside the namespaces"), std::string::npos) << reason;
  EXPECT_NE(reason.find("simulated start-up failure"), std::string::npos) << reason;

  auto required = verify_cli("namespaces", {}, env);
  EXPECT_EQ(required.value("category", ""), "infrastructure_error") << required.dump(2);
  EXPECT_NE(required.value("message", "").find("simulated start-up failure"), std::string::npos) << required.dump(2);
}

// A torch whose CUDA check fails, as a start-up failure of the moment, while `flag` exists and
// the process cannot write beside the shim (a confined candidate); unconfined it would start. On
// PYTHONPATH of this process's judges for the helper's life.
class ShimOfTheMoment {
 public:
  ShimOfTheMoment(const fs::path& dir, const std::string& flag) {
    write_file_atomic(dir / "torch.py",
                      torch_shim("    if os.path.exists(" + py_string(flag) + "):\n"
                                 "        try:\n"
                                 "            open(os.path.join(here, 'probe'), 'w').close()\n"
                                 "        except OSError as e:\n"
                                 "            raise RuntimeError('simulated failure of the moment: %s' % e)\n"));
    if (const char* old = std::getenv("PYTHONPATH")) saved_ = old;
    setenv("PYTHONPATH", dir.string().c_str(), 1);
  }
  ~ShimOfTheMoment() { saved_ ? setenv("PYTHONPATH", saved_->c_str(), 1) : unsetenv("PYTHONPATH"); }

 private:
  std::optional<std::string> saved_;
};

// Under auto, a confined start-up that fails once candidates of the process have run confined is
// the moment's failure (a GPU another process filled for a while, say, which a policy's command
// can do), not the machine's: starting the candidate again unconfined for it would let whoever
// caused it take the confinement off, for that evaluation and every later one of the process. The
// shim fails the candidate's start-up only while a flag file lies in the task's folder and the
// candidate cannot write beside the shim (confined): unconfined, it would start and pass.
TEST_F(Confine, AfterACandidateRanConfinedAFailedConfinedStartIsNotRetriedUnconfined) {
  const std::string flag = (dir_.path() / "task" / "fail_confined_start").string();
  ShimOfTheMoment shim(dir_.path() / "shim", flag);

  auto first = verify("", "auto");
  EXPECT_TRUE(first.value("ok", false)) << first.dump(2);
  expect_confined(first);

  write_file_atomic(flag, "");
  auto failed = verify("", "auto");
  EXPECT_FALSE(failed.value("ok", true)) << failed.dump(2);
  EXPECT_EQ(failed.value("category", ""), "infrastructure_error") << failed.dump(2);
  const std::string message = failed.value("message", "");
  EXPECT_NE(message.find("ran confined before"), std::string::npos) << message;
  EXPECT_NE(message.find("simulated failure of the moment"), std::string::npos) << message;
  EXPECT_FALSE(failed["worker"].contains("unconfined_reason")) << failed.dump(2);  // no start ran unconfined

  fs::remove(flag);
  auto after = verify("", "auto");
  EXPECT_TRUE(after.value("ok", false)) << after.dump(2);
  expect_confined(after);
}

// The same from the first evaluation on, when the process settled confinement before it
// (settle_confinement, as a trainer, a bench and an eval run do before their first episode or
// solution): the very first candidate's failed start is not retried unconfined either.
TEST_F(Confine, ConfinementSettledAheadMakesEvenTheFirstFailedStartAnError) {
  const std::string flag = (dir_.path() / "task" / "fail_confined_start").string();
  ShimOfTheMoment shim(dir_.path() / "shim", flag);
  SandboxOptions options;
  options.cache_dir = cache_dir();
  // (Empty where an earlier test of the same process settled it: ctest runs each in its own.)
  const std::string found = settle_confinement(options, "cpu", 0, false);
  EXPECT_TRUE(found.empty() || found.find("candidates run confined") != std::string::npos) << found;
  EXPECT_EQ(settle_confinement(options, "cpu", 0, false), "");  // settled: nothing more to do

  write_file_atomic(flag, "");
  auto failed = verify("", "auto");
  EXPECT_EQ(failed.value("category", ""), "infrastructure_error") << failed.dump(2);
  EXPECT_NE(failed.value("message", "").find("ran confined before"), std::string::npos) << failed.dump(2);
}

// Points TMPDIR (where the GPU lock files go) at `dir` for the scope: this test's, not the machine's.
class ScopedTmpdir {
 public:
  explicit ScopedTmpdir(const fs::path& dir) {
    const char* old = std::getenv("TMPDIR");
    had_ = old != nullptr;
    if (had_) saved_ = old;
    fs::create_directories(dir);
    setenv("TMPDIR", dir.c_str(), 1);
  }
  ~ScopedTmpdir() { had_ ? setenv("TMPDIR", saved_.c_str(), 1) : unsetenv("TMPDIR"); }

 private:
  bool had_ = false;
  std::string saved_;
};

// The GPUs' lock files, as a solution would look for them to hold one (flock needs only a
// read-only descriptor) and keep its judge from timing it: under the private /tmp the host's
// entries show read-only, but the locks' folder shows empty. With confine: off the same solution
// finds and holds them, so the test cannot pass because the hack was broken.
TEST_F(Confine, TheSolutionCannotReachTheGpuLockFiles) {
  // The lock files of this test's temporary directory, and of /tmp (another process's, whose
  // temporary directory is the default).
  setenv("CUDA_AGENT_HOST_TMPDIR", "/tmp", 1);
  const size_t in_tmp = gpu_lock_files(0).size();
  unsetenv("CUDA_AGENT_HOST_TMPDIR");
  ASSERT_EQ(in_tmp, 4u) << "in /tmp/cuda-agent-locks";
  ScopedTmpdir tmpdir(dir_.path() / "tmp");
  ASSERT_EQ(gpu_lock_files(0).size(), 4u);
  const std::string prelude =
      "import fcntl, glob, tempfile\n"
      "folders = {tempfile.gettempdir(), '/tmp', os.environ.get('TMPDIR', ''),\n"
      "           os.environ.get('CUDA_AGENT_HOST_TMPDIR', '')} - {''}\n"
      "roots = [''] + glob.glob('/proc/[0-9]*/root')\n"
      "paths = [p for r in roots for f in folders\n"
      "         for p in glob.glob(r + f + '/cuda-agent-locks/cuda-agent-gpu*.lock')]\n"
      "held = []\n"
      "for p in paths:\n"
      "    try:\n"
      "        fd = os.open(p, os.O_RDONLY)\n"
      "        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)\n"
      "        held.append(p)\n"
      "    except OSError:\n"
      "        pass\n"
      "assert not held, 'GPU lock files held: %s' % held\n";
  const nlohmann::json confined = verify(prelude, "auto");
  EXPECT_TRUE(confined.value("ok", false)) << confined.dump(2);
  expect_confined(confined);
  const nlohmann::json off = verify(prelude, "off");
  EXPECT_FALSE(off.value("ok", true)) << off.dump(2);
  EXPECT_NE(off.value("message", "").find("GPU lock files held"), std::string::npos) << off.dump(2);
}

// A solution that reads the task's reference solution (its split's solutions/ folder) or another
// episode's (a folder the caller hides, EvalRequest::hidden_paths) at import: confined, it sees
// neither, while its own folder stays readable; unconfined, the same reads succeed (the control).
// A reference solution evaluated where it lies (bench over data/core/solutions) still loads.
TEST_F(Confine, TheSolutionCannotReadTheAnswers) {
  const std::string task = write("split/tasks/t/model.py", kTask);
  const std::string answer = write("split/solutions/t/model_new.py", solution_source(""));
  const std::string peer = write("run/b/model_new.py", "# another episode's solution\n");
  // The history of the repository the split lies in (here the test's folder).
  const std::string history = write(".git/objects/an/swer", "# the answer as committed\n");
  // Other solutions' caches: an evaluated solution's cubins and build folder.
  const fs::path other_build = fs::path(cache_dir()) / "builds" / "0123456789abcdef" / "cuda.cu";
  const fs::path other_cubin = fs::path(cache_dir()) / "nvrtc" / "solutions" / "0123456789abcdef" / "k.cubin";
  for (const fs::path& file : {other_build, other_cubin}) {
    fs::create_directories(file.parent_path());
    write_file_atomic(file, "// another solution's\n");
  }
  const std::string prelude =
      "seen = []\nfor path in [" + py_string(answer) + ", " + py_string(peer) + ", " + py_string(history) + ", " +
      py_string(other_build.string()) + ", " + py_string(other_cubin.string()) + "]:\n"
      "    try:\n        seen.append(open(path).read())\n    except OSError:\n        pass\n"
      "if seen:\n    raise RuntimeError('read the answers: %d' % len(seen))\n"
      "assert 'ModelNew' in open(__file__).read()\n";
  const std::string solution = write("run/a/model_new.py", solution_source(prelude));
  auto eval = [&](const std::string& path, const std::string& confine) {
    return verify_file(task, path, [&](EvalRequest& req) {
      req.hidden_paths = {(dir_.path() / "run").string()};
      req.options.confine = confine;
    });
  };
  const nlohmann::json confined = eval(solution, "auto");
  EXPECT_TRUE(confined.value("ok", false)) << confined.dump(2);
  expect_confined(confined);
  const nlohmann::json off = eval(solution, "off");
  EXPECT_FALSE(off.value("ok", true)) << off.dump(2);
  EXPECT_NE(off.value("message", "").find("read the answers: 5"), std::string::npos) << off.dump(2);
  const nlohmann::json reference = eval(answer, "auto");
  EXPECT_TRUE(reference.value("ok", false)) << reference.dump(2);
  expect_confined(reference);
}

// sandbox.read_scope "system": a copy of an answer anywhere but the hidden folders (another
// folder, a file beside the split) is readable to a candidate that sees the whole file system,
// and not to one confined to the system's and Python's folders, the task's and its own, where a
// correct solution still imports torch and passes.
TEST_F(Confine, TheSystemReadScopeShowsTheCandidateNothingElse) {
  const std::string task = write("split/tasks/t/model.py", kTask);
  const std::string elsewhere = write("elsewhere/t/model_new.py", "# a copy of the answer\n");
  const std::string beside = write("notes.txt", "# the answer, pasted\n");
  const std::string prelude =
      "seen = []\nfor path in [" + py_string(elsewhere) + ", " + py_string(beside) + "]:\n"
      "    try:\n        seen.append(open(path).read())\n    except OSError:\n        pass\n"
      "if ''.join(seen):\n    raise RuntimeError('read the answers: %d' % len(''.join(seen)))\n";
  const std::string solution = write("run/a/model_new.py", solution_source(prelude));
  auto eval = [&](const std::string& scope) {
    return verify_file(task, solution, [&](EvalRequest& req) { req.options.read_scope = scope; });
  };
  const nlohmann::json system = eval("system");
  EXPECT_TRUE(system.value("ok", false)) << system.dump(2);
  expect_confined(system);
  const nlohmann::json all = eval("all");
  EXPECT_FALSE(all.value("ok", true)) << all.dump(2);
  EXPECT_NE(all.value("message", "").find("read the answers"), std::string::npos) << all.dump(2);
}

// The read scope itself: named paths readable, the rest of the folders on the way to them empty
// (folders) or /dev/null (files), the host's /tmp entries as well; writable paths still written.
TEST(ConfineReadScope, OnlyWhatIsNamedAndWhatLiesOnTheWayCanBeRead) {
  if (!userns_unavailable_reason().empty()) GTEST_SKIP() << userns_unavailable_reason();
  TempDir dir("read-scope-");
  for (const char* file : {"shown/a.txt", "other/b.txt", "work/c.txt", "top.txt"})
    write_file_atomic(dir.path() / file, "secret\n");
  TempDir sibling("read-scope-sibling-");  // another entry of the host's /tmp
  write_file_atomic(sibling.path() / "d.txt", "secret\n");
  const std::string script =
      "test \"$(cat " + (dir.path() / "shown/a.txt").string() + ")\" = secret && echo shown=read; "
      "cat " + (dir.path() / "other/b.txt").string() + " 2>/dev/null || echo other=hidden; "
      "test -z \"$(cat " + (dir.path() / "top.txt").string() + ")\" && echo top=empty; "
      "cat " + (sibling.path() / "d.txt").string() + " 2>/dev/null || echo sibling=hidden; "
      "echo new > " + (dir.path() / "work/e.txt").string() + " && echo work=writable; "
      "test -x /usr/bin/env && echo system=read";
  const std::string system = " --visible /usr --visible /bin --visible /lib --visible /lib64 --visible /etc ";
  auto run = [](const std::string& command) {
    std::string out;
    std::unique_ptr<FILE, int (*)(FILE*)> pipe(::popen(command.c_str(), "r"), &::pclose);
    if (!pipe) return out;
    char buf[4096];
    for (size_t n; (n = std::fread(buf, 1, sizeof(buf), pipe.get())) > 0;) out.append(buf, n);
    return out;
  };
  const std::string out = run(std::string(CUDA_AGENT_BINARY) + " confined-exec --visible " + (dir.path() / "shown").string() +
                              system + "--writable " + (dir.path() / "work").string() + " bash -c '" + script + "' 2>&1");
  for (const char* said : {"shown=read", "other=hidden", "top=empty", "sibling=hidden", "work=writable", "system=read"})
    EXPECT_NE(out.find(said), std::string::npos) << said << " in:\n" << out;
  // Nothing it may read lies in /tmp: the private /tmp holds none of the host's entries and is
  // still the process's own to write.
  const std::string tmp = run(std::string(CUDA_AGENT_BINARY) + " confined-exec" + system + "bash -c 'test -e " +
                              dir.path().string() + " || echo host=absent; echo x > /tmp/mine && cat /tmp/mine' 2>&1");
  EXPECT_NE(tmp.find("host=absent"), std::string::npos) << tmp;
  EXPECT_NE(tmp.find("x\n"), std::string::npos) << tmp;
  EXPECT_EQ(read_file(dir.path() / "work/e.txt"), "new\n");
  const ReadScopeCover cover = read_scope_cover(resolve_read_scope({(dir.path() / "shown").string()}));
  const std::string other = fs::canonical(dir.path() / "other").string();
  EXPECT_NE(std::find(cover.dirs.begin(), cover.dirs.end(), other), cover.dirs.end());
  EXPECT_NE(std::find(cover.files.begin(), cover.files.end(), fs::canonical(dir.path() / "top.txt").string()),
            cover.files.end());
  EXPECT_EQ(std::find(cover.dirs.begin(), cover.dirs.end(), fs::canonical(dir.path()).string()), cover.dirs.end())
      << "a folder on the way is walked, not hidden";
}

// The system read scope shows a build toolchain installed outside /usr (the GPU host's
// /opt/gcc/bin/g++ through CXX and CC) as a whole installation: a compiler that reads its
// own <prefix>/libexec still runs confined to the scope.
TEST(ConfineReadScope, ABuildToolchainOutsideTheSystemFoldersIsShownWhole) {
  if (!userns_unavailable_reason().empty()) GTEST_SKIP() << userns_unavailable_reason();
  TempDir dir("read-scope-toolchain-");
  const fs::path prefix = dir.path() / "opt-gcc";
  write_file_atomic(prefix / "libexec/cc1plus", "compiled\n");
  write_file_atomic(prefix / "bin/g++", "#!/bin/sh\ncat \"$(dirname \"$0\")/../libexec/cc1plus\"\n");
  fs::permissions(prefix / "bin/g++", fs::perms::owner_all);
  write_file_atomic(dir.path() / "elsewhere/secret.txt", "secret\n");
  const std::string compiler = (prefix / "bin/g++").string();
  const char* saved = std::getenv("CXX");
  const std::string saved_cxx = saved ? saved : "";
  // A compiler in a home folder's bin/ shows that bin/ alone, not the home.
  const fs::path home = dir.path() / "home";
  write_file_atomic(home / "bin/gcc", "#!/bin/sh\n");
  const char* saved_home_env = std::getenv("HOME");
  const std::string saved_home = saved_home_env ? saved_home_env : "";
  const char* saved_cc_env = std::getenv("CC");
  const std::string saved_cc = saved_cc_env ? saved_cc_env : "";
  setenv("CXX", ("ccache " + compiler + " -m64").c_str(), 1);
  setenv("CC", (home / "bin/gcc").c_str(), 1);
  setenv("HOME", home.c_str(), 1);
  const std::vector<std::string> paths = read_scope_system_paths();
  saved ? setenv("CXX", saved_cxx.c_str(), 1) : unsetenv("CXX");
  saved_cc_env ? setenv("CC", saved_cc.c_str(), 1) : unsetenv("CC");
  saved_home_env ? setenv("HOME", saved_home.c_str(), 1) : unsetenv("HOME");
  EXPECT_NE(std::find(paths.begin(), paths.end(), fs::canonical(prefix).string()), paths.end());
  EXPECT_EQ(std::find(paths.begin(), paths.end(), fs::canonical(dir.path()).string()), paths.end());
  EXPECT_NE(std::find(paths.begin(), paths.end(), fs::canonical(home / "bin").string()), paths.end());
  EXPECT_EQ(std::find(paths.begin(), paths.end(), fs::canonical(home).string()), paths.end());
  std::string visible;
  for (const std::string& path : paths) visible += " --visible " + path;
  const std::string command = std::string(CUDA_AGENT_BINARY) + " confined-exec" + visible + " bash -c '" + compiler +
                              "; cat " + (dir.path() / "elsewhere/secret.txt").string() + " 2>/dev/null || echo other=hidden' 2>&1";
  std::string out;
  std::unique_ptr<FILE, int (*)(FILE*)> pipe(::popen(command.c_str(), "r"), &::pclose);
  ASSERT_TRUE(pipe);
  char buf[4096];
  for (size_t n; (n = std::fread(buf, 1, sizeof(buf), pipe.get())) > 0;) out.append(buf, n);
  EXPECT_NE(out.find("compiled"), std::string::npos) << out;
  EXPECT_NE(out.find("other=hidden"), std::string::npos) << out;
}

// The agent's confined Bash sees the GPU's lock files read-only (no channel between episodes, no
// disk to fill): lock_file takes them through a read-only descriptor, and holds them against the
// host's holders as before.
TEST_F(Confine, ALockFileSeenReadOnlyIsStillTaken) {
  const fs::path lock = dir_.path() / "gpu0.quiet.lock";
  write_file_atomic(lock, "");
  // Two pipes, not sleeps: the child says when it holds the lock, the parent when it has tried.
  int held[2], tried[2];
  ASSERT_EQ(::pipe2(held, O_CLOEXEC), 0);
  ASSERT_EQ(::pipe2(tried, O_CLOEXEC), 0);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    ::close(held[0]);
    ::close(tried[1]);  // the parent's end alone: its exit ends the wait below
    int code = 0;
    try {
      ConfinementPlan plan;  // nothing writable: the lock file is seen read-only
      confine_this_process(plan);
      if (::open(lock.c_str(), O_WRONLY | O_CLOEXEC) >= 0) code = 3;  // writable after all
      const int fd = code == 0 ? lock_file(lock, /*exclusive=*/true, 5.0) : -1;
      if (code == 0 && fd < 0) code = 4;
      const char byte = static_cast<char>(code);
      (void)!::write(held[1], &byte, 1);
      if (code == 0) {
        char done = 0;
        (void)!::read(tried[0], &done, 1);  // held while the parent tries
        ::close(fd);
      }
    } catch (const std::exception& e) {
      std::fprintf(stderr, "%s\n", e.what());
      code = 5;
      (void)!::write(held[1], "\5", 1);
    }
    std::_Exit(code);
  }
  ::close(held[1]);
  ::close(tried[0]);
  char state = 0;
  ASSERT_EQ(::read(held[0], &state, 1), 1) << "the confined process ended before it took the lock";
  ::close(held[0]);
  const int blocked = state == 0 ? lock_file(lock, /*exclusive=*/false, 0.2) : -1;
  (void)!::write(tried[1], "", 1);
  ::close(tried[1]);
  EXPECT_LT(blocked, 0) << "the confined process's exclusive lock should keep this shared one out";
  if (blocked >= 0) ::close(blocked);
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0) << "3: writable, 4: not taken, 5: an error (on stderr)";
  const int after = lock_file(lock, /*exclusive=*/true, 1.0);
  EXPECT_GE(after, 0);
  if (after >= 0) ::close(after);
}

TEST(ConfinePlan, AnswersAreTheSplitsSolutionsFolderFoundAsGivenAndAsResolvedAndTheRepositorysHistory) {
  TempDir dir("answers-");
  for (const char* folder : {"core/tasks/x", "core/solutions/x", "kb/level1", "kb/solutions", "learning/train"})
    fs::create_directories(dir.path() / folder);
  write_file_atomic(dir.path() / "core" / "tasks" / "x" / "model.py", "");
  write_file_atomic(dir.path() / "kb" / "level1" / "1_x.py", "");
  fs::create_directory_symlink(dir.path() / "core" / "tasks" / "x", dir.path() / "learning" / "train" / "x");
  const std::string core = fs::canonical(dir.path() / "core" / "solutions").string();
  EXPECT_EQ(answer_directories((dir.path() / "core/tasks/x/model.py").string()), std::vector<std::string>{core});
  EXPECT_EQ(answer_directories((dir.path() / "learning/train/../../core/tasks/x/model.py").string()),
            std::vector<std::string>{core});
  EXPECT_EQ(answer_directories((dir.path() / "learning/train/x/model.py").string()), std::vector<std::string>{core})
      << "a task reached through a link is hidden by where it lies";
  EXPECT_EQ(answer_directories((dir.path() / "kb/level1/1_x.py").string()),
            std::vector<std::string>{fs::canonical(dir.path() / "kb" / "solutions").string()});
  EXPECT_TRUE(answer_directories((dir.path() / "nowhere/model.py").string()).empty());
  // A repository's history holds the answers as committed: its git folder goes with them; a
  // worktree's `.git` file names its own git folder, whose common folder holds the objects.
  for (const char* folder : {"repo/.git/worktrees/wt", "repo/data/tasks/y", "repo/data/solutions", "wt/data/tasks/y"})
    fs::create_directories(dir.path() / folder);
  write_file_atomic(dir.path() / "repo/data/tasks/y/model.py", "");
  write_file_atomic(dir.path() / "wt/data/tasks/y/model.py", "");
  write_file_atomic(dir.path() / "repo/.git/worktrees/wt/commondir", "../..\n");
  write_file_atomic(dir.path() / "wt/.git", "gitdir: " + (dir.path() / "repo/.git/worktrees/wt").string() + "\n");
  const std::string repo_git = fs::canonical(dir.path() / "repo" / ".git").string();
  EXPECT_EQ(answer_directories((dir.path() / "repo/data/tasks/y/model.py").string()),
            (std::vector<std::string>{fs::canonical(dir.path() / "repo/data/solutions").string(), repo_git}));
  EXPECT_EQ(answer_directories((dir.path() / "wt/data/tasks/y/model.py").string()),
            (std::vector<std::string>{fs::canonical(dir.path() / "repo/.git/worktrees/wt").string(), repo_git}));
  EXPECT_TRUE(path_within(dir.path() / "core" / "solutions" / "x", dir.path() / "core"));
  EXPECT_FALSE(path_within(dir.path() / "core-other", dir.path() / "core"));
  EXPECT_FALSE(may_hide(fs::path(CUDA_AGENT_BINARY).parent_path())) << "the binary's folder";
  EXPECT_TRUE(may_hide(dir.path()));
}

TEST(ConfinePlan, TheCandidateWritesOnlyItsOwnCachesAndCannotSeeTheSecret) {
  TempDir dir("confine-plan-");
  ScopedTmpdir tmpdir(dir.path() / "tmp");
  const std::vector<std::string> writable = {(dir.path() / "nvrtc").string(), (dir.path() / "builds").string()};
  const std::vector<std::string> hidden = {(dir.path() / "secret").string()};
  const ConfinementPlan plan = candidate_confinement_plan(writable, hidden, 1 << 20);
  EXPECT_EQ(plan.writable, writable);
  // The secret and the GPUs' lock files (this process's, and /tmp's where another process made them).
  ASSERT_GE(plan.hidden.size(), 2u);
  EXPECT_EQ(plan.hidden[0], hidden[0]);
  EXPECT_EQ(plan.hidden[1], fs::canonical(dir.path() / "tmp" / "cuda-agent-locks").string());
  for (size_t i = 2; i < plan.hidden.size(); ++i) EXPECT_EQ(plan.hidden[i], "/tmp/cuda-agent-locks");
  EXPECT_EQ(plan.tmpfs_bytes, 1u << 20);
  const std::vector<std::string> private_dirs = {"/tmp", fs::canonical(dir.path() / "tmp").string()};
  EXPECT_EQ(plan.private_dirs, private_dirs) << "/tmp and $TMPDIR";
}

// The quiet lock as the trainer and the workers use it: generations hold it shared, side by side;
// a worker's timed runs take it exclusive, so they wait until no generation holds it, and a
// moved lock is still held.
TEST(GpuLocks, SharedHoldersCoexistAndKeepAnExclusiveOneWaiting) {
  TempDir dir("gpu-locks-");
  ScopedTmpdir tmpdir(dir.path() / "tmp");
  GpuLock first(3, "quiet", /*exclusive=*/false);
  GpuLock second(3, "quiet", /*exclusive=*/false);  // does not wait for the first
  GpuLock moved = std::move(first);
  std::atomic<bool> timed{false};
  std::thread timing([&] {
    GpuLock exclusive(3, "quiet", /*exclusive=*/true);
    timed = true;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  EXPECT_FALSE(timed) << "an exclusive lock was taken beside shared holders";
  second.release();
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  EXPECT_FALSE(timed) << "the moved lock no longer holds";
  moved.release();
  timing.join();
  EXPECT_TRUE(timed);
  EXPECT_TRUE(fs::exists(dir.path() / "tmp" / "cuda-agent-locks" / "cuda-agent-gpu3.quiet.lock"));
  const std::vector<std::string> files = gpu_lock_files(4);
  ASSERT_EQ(files.size(), 4u);
  for (const auto& f : files) EXPECT_TRUE(fs::exists(f)) << f;
  // In a confined process TMPDIR is private: the lock files stay in the host's.
  setenv("CUDA_AGENT_HOST_TMPDIR", (dir.path() / "host").c_str(), 1);
  EXPECT_EQ(gpu_lock_path(4, "gpu"), (dir.path() / "host" / "cuda-agent-locks" / "cuda-agent-gpu4.gpu.lock").string());
  unsetenv("CUDA_AGENT_HOST_TMPDIR");
}

// Shared holders that overlap never leave a lock free at once: on the quiet lock a run's
// generations, its learner, other runs'; on the gpu lock judges compiling baselines or starting
// CUDA (sandbox.compile_before_lock, init_before_lock). The turnstile lets an exclusive taker in
// once those holding the lock when it came are done, and shared takers that come after it wait
// until it is done. Without the turnstile the exclusive taker here waits for ever.
TEST(GpuLocks, OverlappingSharedHoldersDoNotStarveAnExclusiveOne) {
  TempDir dir("gpu-locks-");
  ScopedTmpdir tmpdir(dir.path() / "tmp");
  for (const char* which : {"quiet", "gpu"}) {
    SCOPED_TRACE(which);
    std::atomic<bool> stop{false};
    std::atomic<int> holding{0};
    const auto reader = [&](int offset_ms) {
      std::this_thread::sleep_for(std::chrono::milliseconds(offset_ms));
      while (!stop) {
        GpuLock shared(3, which, /*exclusive=*/false);
        ++holding;
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
        --holding;
      }
    };
    std::thread a(reader, 0), b(reader, 50);
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    const auto start = std::chrono::steady_clock::now();
    GpuLock exclusive(3, which, /*exclusive=*/true, /*max_wait_s=*/20);
    const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    EXPECT_FALSE(exclusive.timed_out()) << "the shared holders kept the exclusive taker out for 20 s";
    EXPECT_EQ(holding.load(), 0) << "a shared holder beside the exclusive one";
    std::this_thread::sleep_for(std::chrono::milliseconds(250));
    EXPECT_EQ(holding.load(), 0) << "a shared taker came in while the exclusive one held the lock";
    exclusive.release();
    stop = true;
    a.join();
    b.join();
    EXPECT_LT(waited, 5.0);
  }
}

// Untimed work in steps (a policy's decoding) holds the quiet lock shared, and lets an evaluation's
// timed run in at its next pause point instead of after its last step; it waits for the run's end
// there, and does not let go while nobody waits. Without the pause the exclusive taker here waits
// the whole 20 s.
TEST(GpuLocks, StepwiseUntimedWorkLetsATimedRunInBetweenTwoSteps) {
  TempDir dir("gpu-locks-");
  ScopedTmpdir tmpdir(dir.path() / "tmp");
  std::atomic<bool> stop{false}, timing{false};
  std::atomic<int> steps{0}, steps_while_timing{0}, pauses{0};
  std::atomic<double> paused_s{0};
  std::thread work([&] {
    QuietSteps quiet(3, /*max_wait_s=*/30, "the test's work");
    while (!stop) {
      if (timing) ++steps_while_timing;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));  // a step's GPU work
      ++steps;
      quiet.pause_point();
    }
    pauses = quiet.pauses();
    paused_s = quiet.paused_s();
  });
  while (steps < 20) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  EXPECT_EQ(lock_holders(gpu_lock_path(3, "quiet")), std::vector<pid_t>{::getpid()}) << "the work holds the lock";
  const auto start = std::chrono::steady_clock::now();
  GpuLock exclusive(3, "quiet", /*exclusive=*/true, /*max_wait_s=*/20);
  const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  ASSERT_FALSE(exclusive.timed_out()) << "the work kept the timed run out until its end";
  timing = true;
  const int steps_before = steps;
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  EXPECT_EQ(steps.load(), steps_before) << "the work stepped on while the timed run held the lock";
  timing = false;
  exclusive.release();
  while (steps < steps_before + 5) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  stop = true;
  work.join();
  EXPECT_LT(waited, 5.0);
  EXPECT_EQ(steps_while_timing.load(), 0);
  EXPECT_EQ(pauses.load(), 1);
  EXPECT_GE(paused_s.load(), 0.25);
}

// quiet_gate, the batch engine's hold: taken before its first round, its pause point on the next
// ones (a waiting timed run gets in between two), let go when the engine idles; each thread that
// calls it holds its own.
TEST(GpuLocks, TheEnginesGateHoldsTheQuietLockWhileItWorksAndStepsAside) {
  TempDir dir("gpu-locks-");
  ScopedTmpdir tmpdir(dir.path() / "tmp");
  const std::string quiet = gpu_lock_path(3, "quiet");
  const std::function<void(bool)> gate = quiet_gate(3, /*max_wait_s=*/30, "the test's engine");
  std::atomic<bool> stop{false};
  std::atomic<int> rounds{0};
  std::thread engine([&] {
    while (!stop) {
      gate(true);
      std::this_thread::sleep_for(std::chrono::milliseconds(10));  // a round's GPU work
      ++rounds;
    }
    gate(false);
  });
  while (rounds < 5) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  EXPECT_EQ(lock_holders(quiet), std::vector<pid_t>{::getpid()});
  const auto start = std::chrono::steady_clock::now();
  GpuLock exclusive(3, "quiet", /*exclusive=*/true, /*max_wait_s=*/20);
  const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  ASSERT_FALSE(exclusive.timed_out());
  EXPECT_LT(waited, 5.0);
  const int before = rounds;
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  EXPECT_LE(rounds.load(), before + 1) << "the engine went on working beside the timed run";
  exclusive.release();
  while (rounds < before + 5) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  // A second thread's hold beside the first one's, then both idle: nothing held.
  std::thread other([&] {
    gate(true);
    gate(false);
  });
  other.join();
  stop = true;
  engine.join();
  EXPECT_TRUE(lock_holders(quiet).empty()) << "an idle engine still holds the quiet lock";
  gate(false);  // idle without a hold: nothing to do
}

// Replies in steps on four threads, one after another, beside a batch engine's gate on a fifth,
// while timed runs take the quiet lock exclusive again and again: no step runs while a timed run
// holds the lock, every timed run gets in within a few steps, and nothing deadlocks.
TEST(GpuLocks, StepwiseHoldersAndTimedRunsNeverOverlapOrDeadlock) {
  TempDir dir("gpu-locks-");
  ScopedTmpdir tmpdir(dir.path() / "tmp");
  std::atomic<bool> stop{false};
  std::atomic<int> in_step{0}, steps{0};
  const auto step = [&] {
    ++in_step;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));  // a decode step's GPU work
    --in_step;
    ++steps;
  };
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&] {
      while (!stop) {
        QuietSteps reply(3, /*max_wait_s=*/30, "the test's reply");
        for (int k = 0; k < 25 && !stop; ++k) {
          step();
          reply.pause_point();
        }
      }
    });
  const std::function<void(bool)> gate = quiet_gate(3, /*max_wait_s=*/30, "the test's engine");
  threads.emplace_back([&] {
    while (!stop) {
      for (int k = 0; k < 40 && !stop; ++k) {
        gate(true);
        step();
      }
      gate(false);  // idle a moment
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  });
  while (steps < 50) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  double longest = 0;
  int overlaps = 0;
  for (int run = 0; run < 15; ++run) {
    const auto start = std::chrono::steady_clock::now();
    GpuLock timed(3, "quiet", /*exclusive=*/true, /*max_wait_s=*/20);
    ASSERT_FALSE(timed.timed_out()) << "run " << run;
    longest = std::max(longest, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    const int before = steps;
    for (int k = 0; k < 10; ++k) {
      overlaps += in_step.load() != 0;
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    EXPECT_EQ(steps.load(), before) << "a step ran while timed run " << run << " held the lock";
    timed.release();
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  stop = true;
  for (auto& t : threads) t.join();
  EXPECT_EQ(overlaps, 0);
  EXPECT_LT(longest, 5.0) << "a timed run waited for whole replies";
  EXPECT_TRUE(lock_holders(gpu_lock_path(3, "quiet")).empty());
}

// QuietGpuPolicy around a policy: each reply holds the quiet lock and gets a pause point; around a
// policy whose GPU work holds the lock itself (a gated batch engine) it holds nothing, since its
// hold would keep a timed run out while the engine steps aside for it.
TEST(GpuLocks, AReplyHoldsTheQuietLockUnlessItsPolicyHoldsItItself) {
  TempDir dir("gpu-locks-");
  ScopedTmpdir tmpdir(dir.path() / "tmp");
  struct Inner final : agent::Policy {
    std::string name() const override { return "inner"; }
    agent::PolicyReply complete(const agent::PolicyRequest& request) override {
      holders = lock_holders(gpu_lock_path(3, "quiet"));
      paused = static_cast<bool>(request.between_steps);
      if (request.between_steps) request.between_steps();
      return {};
    }
    bool holds_quiet_lock_itself() const override { return itself; }
    bool itself = false, paused = false;
    std::vector<pid_t> holders;
  } inner;
  agent::QuietGpuPolicy policy(inner, 3, /*max_wait_s=*/5);
  EXPECT_TRUE(policy.holds_quiet_lock_itself());
  (void)policy.complete(agent::PolicyRequest{});
  EXPECT_EQ(inner.holders, std::vector<pid_t>{::getpid()});
  EXPECT_TRUE(inner.paused);
  inner.itself = true;
  (void)policy.complete(agent::PolicyRequest{});
  EXPECT_TRUE(inner.holders.empty());
  EXPECT_FALSE(inner.paused);
  EXPECT_TRUE(lock_holders(gpu_lock_path(3, "quiet")).empty());
}

// A process that waits for a GPU's lock is named so (GpuWaitName) while it waits, where its
// ancestors (the agent's Bash, over a verify.sh's judge) can see it; the name it had comes back.
TEST(GpuLocks, AProcessWaitingForALockIsNamedForItsAncestors) {
  const std::string before = read_proc_stat("self").comm;
  {
    const GpuWaitName waiting;
    EXPECT_EQ(read_proc_stat("self").comm, kGpuWaitName);
  }
  EXPECT_EQ(read_proc_stat("self").comm, before);
  EXPECT_FALSE(waits_for_gpu_lock(::getpid()));
  int ready[2];
  ASSERT_EQ(::pipe(ready), 0);
  const pid_t child = ::fork();
  if (child == 0) {
    ::setpgid(0, 0);      // killed as one group below
    if (::fork() == 0) {  // a grandchild waits
      const GpuWaitName waiting;
      (void)!::write(ready[1], "r", 1);
      ::pause();
    }
    ::pause();
  }
  char byte = 0;
  ASSERT_EQ(::read(ready[0], &byte, 1), 1);
  EXPECT_TRUE(waits_for_gpu_lock(::getpid()));
  EXPECT_TRUE(waits_for_gpu_lock(child));
  EXPECT_FALSE(waits_for_gpu_lock(1 << 22)) << "no such process";
  ::kill(-child, SIGKILL);
  ::waitpid(child, nullptr, 0);
  ::close(ready[0]);
  ::close(ready[1]);
}

// The judge names itself so while it waits: an evaluation (baselines, which start no candidate)
// whose GPU quiet lock this test holds shows a waiting descendant until the lock is let go.
TEST(GpuLocks, AJudgeWaitingForTheGpusLockIsNamedSo) {
  TempDir dir("gpu-locks-");
  ScopedTmpdir tmpdir(dir.path() / "tmp");
  setenv("CUDA_AGENT_BIN", CUDA_AGENT_BINARY, 1);
  write_file_atomic(dir.path() / "task" / "model.py",
                    "import torch\n\nclass Model(torch.nn.Module):\n    def forward(self, x):\n        return x\n\n"
                    "def get_inputs():\n    return [torch.ones(2)]\n\ndef get_init_inputs():\n    return []\n");
  EvalRequest req;
  req.task_path = (dir.path() / "task" / "model.py").string();
  req.mode = EvalMode::kBaselines;
  req.device = "cuda";
  req.gpu = 6;
  req.gpu_lock = true;
  req.options.quiet_start = true;
  req.options.cache_dir = (dir.path() / "cache").string();
  std::optional<GpuLock> held(std::in_place, 6, "quiet", /*exclusive=*/true);
  auto evaluation = std::async(std::launch::async, [&] { return evaluate(req); });
  bool named = false;
  for (int i = 0; i < 600 && !named; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    named = waits_for_gpu_lock(::getpid());
  }
  EXPECT_TRUE(named) << "no judge named " << kGpuWaitName << " within 30 s";
  held.reset();
  const EvalResult result = evaluation.get();  // without a GPU it ends there, as an infrastructure error
  EXPECT_FALSE(waits_for_gpu_lock(::getpid()));
  EXPECT_GT(result.phase_seconds.count("python_start"), 0u) << result.to_json().dump(2);
}

// A command of an agent's can hold the quiet lock exclusive (`flock -x` on a read-only descriptor,
// in the background): the policy's replies and the learner's updates wait for it at most their
// bound, then go on without it (before, every episode's generation, the holder's own included,
// waited for good).
TEST(GpuLocks, UntimedWorkWaitsBoundedlyForAQuietLockSomebodyKeeps) {
  TempDir dir("gpu-locks-");
  ScopedTmpdir tmpdir(dir.path() / "tmp");
  const std::string quiet = gpu_lock_path(5, "quiet");
  int ready[2];
  ASSERT_EQ(::pipe(ready), 0);
  const pid_t holder = ::fork();
  if (holder == 0) {
    const int fd = ::open(quiet.c_str(), O_RDONLY | O_CREAT, 0644);
    (void)!::flock(fd, LOCK_EX);
    (void)!::write(ready[1], "h", 1);
    ::pause();
    ::_exit(0);
  }
  char byte = 0;
  ASSERT_EQ(::read(ready[0], &byte, 1), 1);
  struct Reply final : agent::Policy {
    std::string name() const override { return "reply"; }
    agent::PolicyReply complete(const agent::PolicyRequest&) override {
      ++calls;
      return agent::PolicyReply{};
    }
    int calls = 0;
  } inner;
  agent::QuietGpuPolicy policy(inner, 5, /*max_wait_s=*/1.0);
  const auto start = std::chrono::steady_clock::now();
  const agent::PolicyReply reply = policy.complete(agent::PolicyRequest{});
  const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_EQ(inner.calls, 1);
  EXPECT_GE(waited, 0.9);
  EXPECT_GE(reply.quiet_wait_s, 0.9) << "the reply's record of its wait";
  EXPECT_LE(reply.quiet_wait_s, waited);
  EXPECT_LT(waited, 10.0);
  {
    const GpuLock none = quiet_for_untimed_work(5, 0.2, "the test's work");
    EXPECT_FALSE(none.timed_out());
    EXPECT_EQ(lock_holders(quiet), std::vector<pid_t>{holder}) << "taken beside the holder";
  }
  ::kill(holder, SIGKILL);
  ::waitpid(holder, nullptr, 0);
  {
    const GpuLock held = quiet_for_untimed_work(5, 0.2, "the test's work");
    // The waits that gave up above left their waiters in the kernel's queue (lock_file); each gets
    // the lock once the holder is gone and lets it go at once: not a holder to count.
    for (int i = 0; i < 200 && lock_holders(quiet).size() > 1; ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    EXPECT_EQ(lock_holders(quiet), std::vector<pid_t>{::getpid()}) << "free again: taken";
  }
  ::close(ready[0]);
  ::close(ready[1]);
}

TEST(ConfineOptions, ConfineIsValidatedAndRoundTrips) {
  SandboxOptions o;
  EXPECT_EQ(o.confine, "auto");
  o.confine = "namespaces";
  EXPECT_EQ(SandboxOptions::from_json(o.to_json()).confine, "namespaces");
  EXPECT_TRUE(o.compile_before_lock);
  o.compile_before_lock = false;
  EXPECT_FALSE(SandboxOptions::from_json(o.to_json()).compile_before_lock);
  EXPECT_FALSE(o.init_before_lock);
  o.init_before_lock = true;
  EXPECT_TRUE(SandboxOptions::from_json(o.to_json()).init_before_lock);
  const nlohmann::json unknown = {{"confine", "bwrap"}};
  EXPECT_THROW(SandboxOptions::from_json(unknown), cuda_agent::Error);
  EvalRequest req;
  req.confine_candidate = false;
  req.unconfined_reason = "known";
  const EvalRequest back = EvalRequest::from_json(nlohmann::json::parse(req.to_json().dump()));
  EXPECT_FALSE(back.confine_candidate);
  EXPECT_EQ(back.unconfined_reason, "known");
}

namespace {

// Runs `body` in a forked child (its exit code: 0 passes, else the failed step's number), so
// that namespaces and the subreaper flag stay out of the test process.
int in_child(const std::function<int()>& body) {
  const pid_t pid = ::fork();
  if (pid == 0) ::_exit(body());
  int status = 0;
  ::waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 100 + WTERMSIG(status);
}

// A process whose parent exits at once (an orphan), sleeping or busy on the CPU for `seconds`.
void start_orphan(bool busy, double seconds) {
  const pid_t middle = ::fork();
  if (middle == 0) {
    if (::fork() == 0) {
      if (!busy) ::execlp("sleep", "sleep", std::to_string(seconds).c_str(), nullptr);
      // Busy for `seconds` of its own CPU time, not of the clock's: on a loaded machine a wall-clock
      // spin may get too little CPU for the watch to count.
      volatile uint64_t x = 0;
      timespec used{};
      do {
        for (int i = 0; i < 100000; ++i) x = x + 1;
        ::clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &used);
      } while (static_cast<double>(used.tv_sec) + static_cast<double>(used.tv_nsec) / 1e9 < seconds);
      ::_exit(0);
    }
    ::_exit(0);
  }
  ::waitpid(middle, nullptr, 0);
}

template <typename F>
bool eventually(F condition) {
  for (int i = 0; i < 100; ++i) {
    if (condition()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return false;
}

// An orphan of a double fork stays the solution's process while it runs, and its CPU counts once
// it ended (reaped or not).
int watch_checks(SolutionProcesses& watch) {
  if (!watch.alive().empty()) return 1;
  start_orphan(false, 0.5);
  if (!eventually([&] { return watch.alive().find("(sleep)") != std::string::npos; })) {
    std::fprintf(stderr, "alive: '%s'\n", watch.alive().c_str());
    return 2;
  }
  if (!eventually([&] { return watch.alive().empty(); })) return 3;
  const double before = watch.ended_cpu_seconds();
  start_orphan(true, 0.3);
  if (!eventually([&] { return watch.alive().empty() && watch.ended_cpu_seconds() >= before + 0.1; })) return 4;
  return 0;
}

}  // namespace

TEST(SolutionProcesses, AnOrphanStaysInSightOfTheCandidateAsItsSubreaper) {
  EXPECT_EQ(in_child([] {
              SolutionProcesses watch;
              watch.start();
              return watch_checks(watch);
            }),
            0);
}

// The filter keeps the watch: the subreaper flag stays on, no child of the candidate's parent
// can be made, and threads, fork and posix_spawn (through clone once clone3 answers ENOSYS)
// still work.
TEST(SolutionProcesses, TheFilterKeepsTheSubreaperAndTheParentage) {
  EXPECT_EQ(in_child([] {
              SolutionProcesses watch;
              watch.start();
              if (::prctl(PR_SET_CHILD_SUBREAPER, 0) == 0 || errno != EPERM) return 1;
              if (!watch.alive().empty()) return 2;
              if (::syscall(SYS_clone, CLONE_PARENT | SIGCHLD, nullptr, nullptr, nullptr, nullptr) != -1 || errno != EPERM)
                return 3;
              if (::syscall(SYS_clone3, nullptr, 0) != -1 || errno != ENOSYS) return 4;
              std::thread t([] {});
              t.join();
              const pid_t child = ::fork();
              if (child == 0) ::_exit(7);
              int status = 0;
              if (child < 0 || ::waitpid(child, &status, 0) != child || WEXITSTATUS(status) != 7) return 5;
              if (::system("exit 3") != 3 << 8) return 6;  // posix_spawn
              return 0;
            }),
            0);
}

namespace {

// Changes to `target`'s limits, priority and scheduling that leave them as they are (each set to
// what it is), which the kernel still checks as any other change. Returns a bit per call that
// failed, in the order of kOtherProcessCalls (EPERM only: another error is 0x100, a broken test).
constexpr const char* kOtherProcessCalls[] = {
    "prlimit",           "prlimit (new limit at an address whose low half is 0)",
    "setpriority",       "setpriority (its process group)",
    "sched_setaffinity", "sched_setscheduler",
    "sched_setparam",    "ioprio_set"};
int change_without_changing(pid_t target) {
  int refused = 0;
  const auto note = [&](int bit, long rc) {
    if (rc == 0) return;
    if (errno != EPERM) refused |= 0x100;
    refused |= 1 << bit;
  };
  rlimit core{};
  if (::prlimit(target, RLIMIT_CORE, nullptr, &core) != 0) return 0x100;  // reading stays allowed
  note(0, ::prlimit(target, RLIMIT_CORE, &core, nullptr));
  // A pointer whose low 32 bits are 0: a filter that read only those would take it for NULL.
  void* high = ::mmap(reinterpret_cast<void*>(0x7e0000000000ULL), 4096, PROT_READ | PROT_WRITE,
                      MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
  if (high != reinterpret_cast<void*>(0x7e0000000000ULL)) return 0x100;
  *static_cast<rlimit*>(high) = core;
  note(1, ::syscall(SYS_prlimit64, target, RLIMIT_CORE, high, nullptr));
  errno = 0;
  const int nice = ::getpriority(PRIO_PROCESS, target);
  if (errno != 0) return 0x100;
  note(2, ::setpriority(PRIO_PROCESS, target, nice));
  note(3, ::setpriority(PRIO_PGRP, ::getpgid(target), ::getpriority(PRIO_PGRP, ::getpgid(target))));
  cpu_set_t mask;
  if (::sched_getaffinity(target, sizeof mask, &mask) != 0) return 0x100;
  note(4, ::sched_setaffinity(target, sizeof mask, &mask));
  sched_param param{};
  if (::sched_getparam(target, &param) != 0) return 0x100;
  note(5, ::sched_setscheduler(target, ::sched_getscheduler(target), &param));
  note(6, ::sched_setparam(target, &param));
  constexpr int kWhoProcess = 1;
  const long ioprio = ::syscall(SYS_ioprio_get, kWhoProcess, target);
  if (ioprio < 0) return 0x100;
  note(7, ::syscall(SYS_ioprio_set, kWhoProcess, target, ioprio));
  return refused;
}

}  // namespace

// The filter of the candidate and of the agent's commands: another process's limits, priority
// and scheduling cannot be changed (an RLIMIT_CPU of one second would end the judge, or another
// evaluation, with a SIGKILL no signal scope sees; SCHED_IDLE would starve its baselines), the
// process's own can, and another's limits can still be read. The control, without the filter,
// makes the same calls succeed (as root the kernel's own checks refuse a caller without
// capabilities; this child keeps them).
TEST(SyscallFilter, AnotherProcesssLimitsAndSchedulingCannotBeChangedButItsOwnCan) {
  const pid_t target = start_sleeper();
  ASSERT_GT(target, 0);
  const int allowed = in_child([&] { return change_without_changing(target); });
  const int filtered = in_child([&] {
    install_syscall_filter({.own_process_only = true});
    return change_without_changing(target);
  });
  const int own = in_child([] {
    install_syscall_filter({.own_process_only = true, .keep_descendants = true});
    // Its process group names other processes too: refused even for its own.
    const int refused = change_without_changing(0);
    if (refused != 1 << 3) return refused | 0x800;
    // Lowering its own priority and limits, as `nice` and `ulimit` do.
    if (::setpriority(PRIO_PROCESS, 0, 5) != 0 || ::getpriority(PRIO_PROCESS, 0) != 5) return 0x200;
    const rlimit small{1 << 20, 1 << 20};
    if (::setrlimit(RLIMIT_CORE, &small) != 0) return 0x400;
    return 0;
  });
  ::kill(target, SIGKILL);
  ::waitpid(target, nullptr, 0);
  ASSERT_LT(allowed, 0x100) << "the control's calls failed for another reason than EPERM";
  ASSERT_EQ(filtered & 0x100, 0) << "a filtered call failed for another reason than EPERM: " << filtered;
  EXPECT_EQ(own, 0) << "the process's own limits or scheduling could not be changed under the filter: " << own;
  for (int bit = 0; bit < 8; ++bit) {
    if (allowed & (1 << bit)) continue;  // refused here without the filter too
    EXPECT_TRUE(filtered & (1 << bit)) << kOtherProcessCalls[bit] << " of another process passed the filter";
  }
  EXPECT_EQ(allowed & 1, 0) << "the control could not change another process's limits: the test shows nothing here";
}

namespace {

// Whether a process of the same user without capabilities (a solution's, the agent's command's)
// can read 8 bytes of `pid`'s memory: 0, or the errno.
int read_as_capless_peer(pid_t pid) {
  unsigned long start = 0;
  {
    std::ifstream maps("/proc/" + std::to_string(pid) + "/maps");
    std::string range;
    if (!(maps >> range)) return -1;
    start = std::stoul(range.substr(0, range.find('-')), nullptr, 16);
  }
  return in_child([&] {
    __user_cap_header_struct header{_LINUX_CAPABILITY_VERSION_3, 0};
    __user_cap_data_struct none[2] = {};
    if (::syscall(SYS_capset, &header, none) != 0) return 200;
    char buffer[8];
    iovec local{buffer, sizeof buffer}, remote{reinterpret_cast<void*>(start), sizeof buffer};
    return ::process_vm_readv(pid, &local, 1, &remote, 1, 0) == sizeof buffer ? 0 : errno;
  });
}

}  // namespace

// The process that holds the results and their keys (here a verify; a trainer, an eval or bench
// run alike) is not dumpable, nor is the candidate process once it is confined, so a process of
// the user's without CAP_SYS_PTRACE cannot read (or write) their memory: where no Landlock domain
// keeps a solution or the agent's command from ptrace (a kernel before 6.12, confine: off), that
// would forge a reward, or fail another evaluation's solution. The control, a
// plain process of the user's, can be read. Both run without capabilities, as a user who is not
// root runs them.
TEST_F(Confine, TheProcessHoldingTheResultsCannotBeReadByAnotherOfTheUsers) {
  const fs::path pid_file = dir_.path() / unique_name("candidate-pid");
  const std::string solution =
      write(unique_name("slow") + "/model_new.py", solution_source("import time\nopen(" + py_string(pid_file.string()) +
                                                                   ", 'w').write(str(os.getpid()))\ntime.sleep(6)\n"));
  SubprocessResult run;
  std::thread verify([&] {
    SubprocessOptions sp;
    // Without capabilities, as a user who is not root runs it (as root the kernel also refuses a
    // reader whose capabilities are not a superset of the process's, dumpable or not).
    sp.argv = {"setpriv", "--bounding-set=-all", "--inh-caps=-all", CUDA_AGENT_BINARY, "verify", "--task",
               task_,     "--solution",          solution,          "--device",        "cpu",    "--json",
               "--set",   "sandbox.trials=1"};
    sp.stdout_path = (dir_.path() / unique_name("verify-out")).string();
    sp.timeout_s = 120;
    run = run_subprocess(sp);
  });
  pid_t caller = 0;
  for (int i = 0; i < 200 && caller == 0; ++i) {
    for (const auto& [pid, stat] : children_of(::getpid()))
      if (stat.comm == "cuda-agent") caller = pid;
    if (caller == 0) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  pid_t candidate = 0;
  // Up to two minutes: the judge starts Python and torch first, several seconds on a loaded machine.
  for (int i = 0; i < 6000 && candidate == 0; ++i) {
    if (fs::exists(pid_file) && !read_file(pid_file).empty())
      candidate = static_cast<pid_t>(std::stol(read_file(pid_file)));
    else
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  // Read the caller only once its candidate runs: found by its name right after the exec, it is
  // dumpable until its main() has run (the kernel makes every exec'd process dumpable again).
  const int caller_read = caller == 0 ? -1 : read_as_capless_peer(caller);
  const int candidate_read = candidate == 0 ? -1 : read_as_capless_peer(candidate);
  const pid_t plain = ::fork();  // dumpable, without capabilities too
  if (plain == 0) {
    __user_cap_header_struct header{_LINUX_CAPABILITY_VERSION_3, 0};
    __user_cap_data_struct none[2] = {};
    ::syscall(SYS_capset, &header, none);
    for (int i = 0; i < 300; ++i) ::usleep(100000);
    ::_exit(0);
  }
  for (int i = 0;
       i < 200 &&
       read_file("/proc/" + std::to_string(plain) + "/status").find("CapPrm:\t0000000000000000") == std::string::npos;
       ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));  // its capabilities dropped
  const int plain_read = read_as_capless_peer(plain);
  ::kill(plain, SIGKILL);
  ::waitpid(plain, nullptr, 0);
  verify.join();
  ASSERT_NE(caller, 0) << "the verify process was not found";
  EXPECT_EQ(caller_read, EPERM) << "the verify process's memory could be read";
  ASSERT_NE(candidate, 0) << "the solution did not write its pid";
  EXPECT_EQ(candidate_read, EPERM) << "the candidate process's memory could be read";
  EXPECT_EQ(plain_read, 0) << "the control could not be read: the test shows nothing here";
  EXPECT_TRUE(run.ok()) << run.describe();
}
