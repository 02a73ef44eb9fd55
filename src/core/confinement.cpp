#include "cuda_agent/core/confinement.h"

#include <dirent.h>
#include <fcntl.h>
#include <linux/capability.h>
#include <sched.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <climits>
#include <cstdio>
#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <random>
#include <sstream>
#include <system_error>
#include <utility>

#include <fmt/format.h>

#include "cuda_agent/core/error.h"
#include "cuda_agent/core/files.h"
#include "cuda_agent/core/gpu_memory.h"
#include "cuda_agent/core/proc_stat.h"
#include "cuda_agent/core/syscall_filter.h"
#include "cuda_agent/core/unique_fd.h"

namespace cuda_agent {
namespace {

// The path through which mount(2) and open(2) reach what `fd` refers to (or its entry `child`),
// even once its own path is covered by another mount.
std::string proc_path(const UniqueFd& fd, const std::string& child = "") {
  return "/proc/self/fd/" + std::to_string(fd.get()) + (child.empty() ? "" : "/" + child);
}

UniqueFd open_path(const std::string& path, const char* what) {
  const int fd = ::open(path.c_str(), O_PATH | O_CLOEXEC);
  const int err = errno;
  CA_CHECK(fd >= 0, "cannot open the {} {}: {}", what, path, errno_text(err));
  return UniqueFd(fd);
}

// The id maps want their whole text in one write().
void write_proc_file(const std::string& path, const std::string& text) {
  UniqueFd fd(::open(path.c_str(), O_WRONLY | O_CLOEXEC));
  int err = errno;
  CA_CHECK(fd.get() >= 0, "cannot open {}: {}", path, errno_text(err));
  const ssize_t n = ::write(fd.get(), text.data(), text.size());
  err = errno;
  CA_CHECK(n == static_cast<ssize_t>(text.size()), "cannot write '{}' to {}: {}", text, path, errno_text(err));
}

int thread_count() {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("Threads:", 0) == 0) return std::atoi(line.c_str() + 8);
  return -1;
}

// mountinfo escapes space, tab, newline and backslash as \ooo.
std::string unescape(const std::string& text) {
  std::string out;
  for (size_t i = 0; i < text.size(); ++i) {
    if (text[i] == '\\' && i + 3 < text.size() && std::isdigit(static_cast<unsigned char>(text[i + 1]))) {
      out += static_cast<char>(std::stoi(text.substr(i + 1, 3), nullptr, 8));
      i += 3;
    } else {
      out += text[i];
    }
  }
  return out;
}

struct MountPoint {
  std::string path;
  std::string fstype;
};

// This namespace's mounts, parents before children (mountinfo's order).
std::vector<MountPoint> mount_points() {
  std::ifstream in("/proc/self/mountinfo");
  CA_CHECK(in, "cannot read /proc/self/mountinfo: is /proc mounted?");
  std::vector<MountPoint> mounts;
  std::string line;
  while (std::getline(in, line)) {
    // id parent major:minor root mount-point options [optional...] - fstype source super-options
    std::istringstream fields(line);
    std::string id, parent, dev, root, point, word;
    fields >> id >> parent >> dev >> root >> point;
    while (fields >> word && word != "-") continue;
    std::string fstype;
    fields >> fstype;
    if (!point.empty()) mounts.push_back({unescape(point), fstype});
  }
  return mounts;
}

// The per-mount flags a bind remount must repeat: the kernel locks them on mounts that came
// from the parent namespace, and a remount that drops one fails with EPERM.
unsigned long kept_flags(const struct statvfs& st) {
  unsigned long flags = 0;
  if (st.f_flag & ST_NOSUID) flags |= MS_NOSUID;
  if (st.f_flag & ST_NODEV) flags |= MS_NODEV;
  if (st.f_flag & ST_NOEXEC) flags |= MS_NOEXEC;
  if (st.f_flag & ST_NOATIME) flags |= MS_NOATIME;
  if (st.f_flag & ST_NODIRATIME) flags |= MS_NODIRATIME;
  if (st.f_flag & ST_RELATIME) flags |= MS_RELATIME;
  return flags;
}

bool unreachable(int err) { return err == EACCES || err == ENOENT || err == ENOTDIR || err == ELOOP; }

// Makes the mount at `path` read-only or writable (a bind remount: this mount's flags only,
// not the file system's). Returns false when `path` cannot be reached.
bool remount(const std::string& path, bool read_only) {
  struct statvfs st{};
  if (::statvfs(path.c_str(), &st) != 0) {
    const int err = errno;
    if (unreachable(err)) return false;
    CA_FAIL("cannot inspect the mount {}: {}", path, errno_text(err));
  }
  if (read_only == static_cast<bool>(st.f_flag & ST_RDONLY)) return true;
  const unsigned long flags = MS_REMOUNT | MS_BIND | kept_flags(st) | (read_only ? MS_RDONLY : 0);
  if (::mount(nullptr, path.c_str(), nullptr, flags, nullptr) != 0) {
    const int err = errno;
    if (unreachable(err)) return false;
    CA_FAIL("cannot remount {} {}: {}", path, read_only ? "read-only" : "writable", errno_text(err));
  }
  return true;
}

// Binds `source` (with the mounts below it) onto `target`. (Not named bind: with <functional> in
// view, an unqualified bind(std::string, ...) finds std::bind by ADL, a silent no-op.)
void bind_mount(const std::string& source, const std::string& target, const std::string& what) {
  if (::mount(source.c_str(), target.c_str(), nullptr, MS_BIND | MS_REC, nullptr) != 0) {
    const int err = errno;
    CA_FAIL("cannot bind {} onto {}: {}", what, target, errno_text(err));
  }
}

void mount_tmpfs(const std::string& target, mode_t mode, uint64_t bytes, unsigned long flags) {
  std::string options = fmt::format("mode={:o}", mode & 07777);
  if (bytes > 0) options += fmt::format(",size={}", bytes);
  if (::mount("tmpfs", target.c_str(), "tmpfs", flags, options.c_str()) != 0) {
    const int err = errno;
    CA_FAIL("cannot mount a private tmpfs on {}: {}", target, errno_text(err));
  }
}

// An empty directory or file for a mount to sit on, in a tmpfs of ours.
void make_mount_point(const std::string& path, bool directory) {
  if (directory) {
    if (::mkdir(path.c_str(), 0755) == 0 || errno == EEXIST) return;
  } else {
    UniqueFd fd(::open(path.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0644));
    if (fd.get() >= 0) return;
  }
  const int err = errno;
  CA_FAIL("cannot create the mount point {}: {}", path, errno_text(err));
}

struct Entry {
  std::string name;
  bool directory = false;
  bool symlink = false;
  std::string link_target;
};

// The entries of the directory `path`, by name; those that vanish while it is read are left out.
std::vector<Entry> list_entries(const std::string& path) {
  std::vector<Entry> entries;
  std::unique_ptr<DIR, int (*)(DIR*)> dir(::opendir(path.c_str()), &::closedir);
  const int err = errno;
  CA_CHECK(dir != nullptr, "cannot list {}: {}", path, errno_text(err));
  while (dirent* d = ::readdir(dir.get())) {
    const std::string name = d->d_name;
    if (name == "." || name == "..") continue;
    struct stat st{};
    if (::fstatat(::dirfd(dir.get()), name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) continue;
    Entry e{name, S_ISDIR(st.st_mode), S_ISLNK(st.st_mode), ""};
    if (e.symlink) {
      char target[PATH_MAX];
      const ssize_t n = ::readlinkat(::dirfd(dir.get()), name.c_str(), target, sizeof(target) - 1);
      if (n < 0) continue;
      e.link_target.assign(target, static_cast<size_t>(n));
    }
    entries.push_back(std::move(e));
  }
  std::sort(entries.begin(), entries.end(), [](const Entry& a, const Entry& b) { return a.name < b.name; });
  return entries;
}

// Puts each entry of the original directory (reached through `original`) back under `target`:
// symlinks recreated, everything else bound read-only.
void restore_entries(const UniqueFd& original, const std::vector<Entry>& entries, const std::string& target) {
  for (const Entry& e : entries) {
    const std::string path = target + "/" + e.name;
    if (e.symlink) {
      if (::symlink(e.link_target.c_str(), path.c_str()) != 0 && errno != EEXIST) {
        const int err = errno;
        CA_FAIL("cannot recreate the link {}: {}", path, errno_text(err));
      }
      continue;
    }
    make_mount_point(path, e.directory);
    if (::mount(proc_path(original, e.name).c_str(), path.c_str(), nullptr, MS_BIND | MS_REC, nullptr) != 0) {
      const int err = errno;
      if (unreachable(err)) continue;  // gone since it was listed, or not ours to see
      CA_FAIL("cannot bind {} back into the private {}: {}", path, target, errno_text(err));
    }
    remount(path, /*read_only=*/true);
  }
}

// /dev: a read-only tmpfs with the few devices programs use, the GPU's (`gpu_devices`), and a
// private /dev/shm.
void minimal_dev(uint64_t tmpfs_bytes, bool gpu_devices) {
  UniqueFd host_dev(open_path("/dev", "device directory"));
  std::vector<Entry> nodes;
  for (Entry& e : list_entries("/dev"))
    if (!e.symlink && ((gpu_devices && e.name.rfind("nvidia", 0) == 0) || e.name == "null" || e.name == "zero" ||
                       e.name == "full" || e.name == "random" || e.name == "urandom" || e.name == "tty"))
      nodes.push_back(std::move(e));
  mount_tmpfs("/dev", 0755, 1 << 20, MS_NOSUID | MS_NODEV | MS_NOEXEC);
  for (const Entry& e : nodes) {
    make_mount_point("/dev/" + e.name, e.directory);
    bind_mount(proc_path(host_dev, e.name), "/dev/" + e.name, "the device /dev/" + e.name);
  }
  make_mount_point("/dev/shm", true);
  mount_tmpfs("/dev/shm", 01777, tmpfs_bytes, MS_NOSUID | MS_NODEV);
  const std::pair<const char*, const char*> links[] = {{"fd", "/proc/self/fd"},
                                                       {"stdin", "/proc/self/fd/0"},
                                                       {"stdout", "/proc/self/fd/1"},
                                                       {"stderr", "/proc/self/fd/2"}};
  for (const auto& [name, to] : links) {
    if (::symlink(to, (std::string("/dev/") + name).c_str()) != 0) {
      const int err = errno;
      CA_FAIL("cannot create the link /dev/{}: {}", name, errno_text(err));
    }
  }
  remount("/dev", /*read_only=*/true);
}

void drop_capabilities() {
  if (::prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0) != 0 && errno != EINVAL) {
    const int err = errno;
    CA_FAIL("cannot clear the ambient capabilities: {}", errno_text(err));
  }
  for (int cap = 0; cap < 64; ++cap) {
    if (::prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) == 0) continue;
    const int err = errno;
    if (err == EINVAL) break;  // past the kernel's last capability
    CA_FAIL("cannot drop capability {} from the bounding set: {}", cap, errno_text(err));
  }
  if (::prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) {
    const int err = errno;
    CA_FAIL("cannot set no_new_privs: {}", errno_text(err));
  }
  __user_cap_header_struct header{_LINUX_CAPABILITY_VERSION_3, 0};
  __user_cap_data_struct data[_LINUX_CAPABILITY_U32S_3] = {};
  if (::syscall(SYS_capset, &header, data) != 0) {
    const int err = errno;
    CA_FAIL("cannot drop the capabilities: {}", errno_text(err));
  }
}

// read_scope_cover's walk of the folder `dir`, which lies on the way to a path of `keep`.
void cover_outside(const std::string& dir, const std::vector<std::string>& keep, ReadScopeCover& cover) {
  std::vector<Entry> entries;
  try {
    entries = list_entries(dir);
  } catch (const Error&) {
    return;  // unreadable to us: unreadable to the confined process too
  }
  for (const Entry& e : entries) {
    const std::string path = (dir == "/" ? "" : dir) + "/" + e.name;
    if (e.symlink) continue;
    if (std::any_of(keep.begin(), keep.end(), [&](const std::string& k) { return path_under(path, k); })) continue;
    if (std::any_of(keep.begin(), keep.end(), [&](const std::string& k) { return path_under(k, path); })) {
      if (e.directory) cover_outside(path, keep, cover);
      continue;
    }
    struct stat st{};
    if (::lstat(path.c_str(), &st) != 0) continue;
    if (S_ISDIR(st.st_mode)) cover.dirs.push_back(path);
    else if (S_ISREG(st.st_mode)) cover.files.push_back(path);
  }
}

}  // namespace

bool path_under(const std::string& path, const std::string& dir) {
  return path == dir || (path.size() > dir.size() && path.compare(0, dir.size(), dir) == 0 &&
                         (dir.back() == '/' || path[dir.size()] == '/'));
}

bool read_scope_shows(const std::vector<std::string>& scope, const std::string& path) {
  return std::any_of(scope.begin(), scope.end(), [&](const std::string& k) { return path_under(path, k) || path_under(k, path); });
}

std::vector<std::string> resolve_read_scope(const std::vector<std::string>& visible) {
  std::vector<std::string> scope;
  for (const std::string& v : visible) {
    std::error_code ec;
    const std::filesystem::path resolved = std::filesystem::canonical(v, ec);
    if (!ec) scope.push_back(resolved.string());
  }
  for (const char* system : {"/dev", "/proc", "/sys"}) scope.push_back(system);
  return scope;
}

ReadScopeCover read_scope_cover(const std::vector<std::string>& scope, const std::vector<std::string>& private_dirs) {
  ReadScopeCover cover;
  if (std::find(scope.begin(), scope.end(), "/") == scope.end()) cover_outside("/", scope, cover);
  const auto is_private = [&](const std::string& p) {
    return std::find(private_dirs.begin(), private_dirs.end(), p) != private_dirs.end();
  };
  const auto own = [&](const std::string& path) {
    return is_private(path) || is_private(std::filesystem::path(path).parent_path().string());
  };
  cover.dirs.erase(std::remove_if(cover.dirs.begin(), cover.dirs.end(), own), cover.dirs.end());
  cover.files.erase(std::remove_if(cover.files.begin(), cover.files.end(), own), cover.files.end());
  return cover;
}

void confine_this_process(const ConfinementPlan& plan) {
  namespace fs = std::filesystem;
  auto canonical = [](const std::string& path, const char* what) {
    std::error_code ec;
    fs::path p = fs::canonical(path, ec);
    CA_CHECK(!ec, "cannot confine: the {} {} cannot be resolved: {}", what, path, ec.message());
    return p.string();
  };
  std::vector<std::string> writable, private_dirs, read_only;
  for (const auto& p : plan.writable) writable.push_back(canonical(p, "writable path"));
  for (const auto& p : plan.private_dirs) private_dirs.push_back(canonical(p, "private directory"));
  for (const auto& p : plan.read_only) read_only.push_back(canonical(p, "read-only path"));
  std::vector<std::string> hidden;
  for (const auto& p : plan.hidden) hidden.push_back(canonical(p, "hidden directory"));
  // The read scope: what lies outside it is hidden with the hidden directories.
  // A private directory's host entries are not bound back unless the scope shows them (other
  // processes come and go there: nothing of theirs is covered, it is simply not there).
  ReadScopeCover outside;
  std::vector<std::string> scope;
  if (!plan.visible.empty()) {
    std::vector<std::string> visible = plan.visible;
    for (const auto* list : {&writable, &read_only}) visible.insert(visible.end(), list->begin(), list->end());
    scope = resolve_read_scope(visible);
    outside = read_scope_cover(scope, private_dirs);
  }
  const size_t plan_hidden = hidden.size();  // those after it are the scope's cover: they may vanish meanwhile
  for (const std::string& dir : outside.dirs)
    if (std::find(hidden.begin(), hidden.end(), dir) == hidden.end()) hidden.push_back(dir);
  // Parents first, so that a writable path inside another one is bound on top of it.
  std::sort(writable.begin(), writable.end());
  std::error_code ec;
  const fs::path cwd = fs::current_path(ec);

  const int threads = thread_count();
  CA_CHECK(threads == 1, "cannot confine: the process has {} threads, and a new user namespace needs exactly one; "
           "confine first thing, before anything starts a thread", threads);
  const uid_t uid = ::geteuid();
  const gid_t gid = ::getegid();
  if (::unshare(CLONE_NEWUSER | CLONE_NEWNS | CLONE_NEWNET | CLONE_NEWIPC) != 0) {
    const int err = errno;
    CA_FAIL("unshare(user, mount, network, IPC namespaces) failed: {}{}", errno_text(err),
            err == EPERM || err == ENOSPC || err == EINVAL
                ? " (this kernel or its settings do not let unprivileged users create user namespaces: see "
                  "kernel.unprivileged_userns_clone, user.max_user_namespaces, "
                  "kernel.apparmor_restrict_unprivileged_userns)"
                : "");
  }
  try {
    write_proc_file("/proc/self/setgroups", "deny");
    write_proc_file("/proc/self/uid_map", fmt::format("{} {} 1", uid, uid));
    write_proc_file("/proc/self/gid_map", fmt::format("{} {} 1", gid, gid));
    // Nothing done below may reach the parent namespace.
    if (::mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0) {
      const int err = errno;
      CA_FAIL("cannot make the mounts private to the new namespace: {}", errno_text(err));
    }
  } catch (const Error& e) {
    CA_FAIL("{} (the kernel let this process create a user namespace but not act in it; on Ubuntu 23.10 and "
            "later, kernel.apparmor_restrict_unprivileged_userns=1 does that unless an AppArmor profile grants "
            "this binary 'userns')",
            e.what());
  }

  // 1. Every mount read-only, but /proc: the CUDA driver does not initialise on a read-only /proc
  // (cuInit: "OS call failed", seen on the H200 host). Its parts that reach beyond this process
  // (kernel settings, sysrq, IRQs, buses, file systems) are made read-only instead, as container
  // runtimes do; what stays writable is this process's own files.
  std::vector<std::string> procs;
  for (const MountPoint& m : mount_points()) {
    if (m.fstype == "autofs") continue;
    if (m.fstype == "proc") procs.push_back(m.path);
    else remount(m.path, /*read_only=*/true);
  }
  for (const std::string& proc : procs)
    for (const char* part : {"sys", "sysrq-trigger", "irq", "bus", "fs"}) {
      const std::string path = proc + "/" + part;
      if (::access(path.c_str(), F_OK) != 0) continue;
      bind_mount(path, path, path);
      remount(path, /*read_only=*/true);
    }
  struct statvfs root{};
  CA_ASSERT(::statvfs("/", &root) == 0 && (root.f_flag & ST_RDONLY), "/ is still writable after the remounts");

  // 2. Handles on what gets covered next, so it can be bound back.
  std::vector<UniqueFd> writable_fds, read_only_fds;
  for (const auto& w : writable) writable_fds.push_back(open_path(w, "writable path"));
  for (const auto& r : read_only) read_only_fds.push_back(open_path(r, "read-only path"));
  struct PrivateDir {
    std::string path;
    UniqueFd original;
    std::vector<Entry> entries;
    mode_t mode = 01777;
  };
  std::vector<PrivateDir> privates;
  for (const auto& d : private_dirs) {
    PrivateDir p{d, open_path(d, "private directory"), list_entries(d), 01777};
    if (!scope.empty())
      p.entries.erase(std::remove_if(p.entries.begin(), p.entries.end(),
                                     [&](const Entry& e) { return !read_scope_shows(scope, d + "/" + e.name); }),
                      p.entries.end());
    struct stat st{};
    if (::stat(d.c_str(), &st) == 0) p.mode = st.st_mode;
    privates.push_back(std::move(p));
  }

  // 3. /dev and the private directories.
  minimal_dev(plan.tmpfs_bytes, plan.gpu_devices);
  for (PrivateDir& p : privates) {
    mount_tmpfs(p.path, p.mode, plan.tmpfs_bytes, MS_NOSUID | MS_NODEV);
    restore_entries(p.original, p.entries, p.path);
  }

  // 4. Hidden directories: an empty tmpfs on each, read-only once what is shown inside it (a
  // writable or read-only path: an episode's workspace inside its hidden run folder) has its
  // mount point there.
  std::vector<bool> hidden_mounted;
  for (size_t i = 0; i < hidden.size(); ++i) {
    const std::string& h = hidden[i];
    // One inside another hidden directory is hidden with it.
    const bool inside = std::any_of(hidden.begin(), hidden.end(), [&](const std::string& o) { return o != h && path_under(h, o); });
    bool mounted = !inside;
    // The scope's cover needs no room for mount points; a hidden folder that cannot be reached
    // (removed since it was listed, or a host entry of a private directory the scope left out)
    // has nothing to hide.
    const std::string options = i >= plan_hidden ? "mode=755,size=4096" : "mode=755,size=1048576";
    if (mounted && ::mount("tmpfs", h.c_str(), "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC, options.c_str()) != 0) {
      const int err = errno;
      if (!unreachable(err)) CA_FAIL("cannot mount a private tmpfs on {}: {}", h, errno_text(err));
      mounted = false;
    }
    hidden_mounted.push_back(mounted);
  }
  // Files outside the read scope: /dev/null (the host's, bound into the new /dev) in their place.
  for (const std::string& file : outside.files) {
    if (::mount("/dev/null", file.c_str(), nullptr, MS_BIND, nullptr) != 0) {
      const int err = errno;
      if (unreachable(err)) continue;  // gone since, or inside a folder hidden above
      CA_FAIL("cannot hide {} (outside the read scope): {}", file, errno_text(err));
    }
    remount(file, /*read_only=*/true);
  }
  // A mount point for `path` where the mounts above hid it (inside a private or hidden tmpfs).
  auto mount_point = [&](const std::string& path, const struct stat& st, const char* what) {
    if (::access(path.c_str(), F_OK) == 0) return;
    const bool covered =
        std::any_of(privates.begin(), privates.end(), [&](const PrivateDir& p) { return path_under(path, p.path); }) ||
        std::any_of(hidden.begin(), hidden.end(), [&](const std::string& h) { return path_under(path, h); });
    CA_CHECK(covered, "cannot confine: the {} {} is not visible after the mounts", what, path);
    fs::create_directories(fs::path(path).parent_path(), ec);
    make_mount_point(path, S_ISDIR(st.st_mode));
  };

  // 5. The writable paths, on top.
  for (size_t i = 0; i < writable.size(); ++i) {
    const std::string& w = writable[i];
    struct stat st{};
    CA_CHECK(::fstat(writable_fds[i].get(), &st) == 0, "cannot inspect the writable path {}", w);
    mount_point(w, st, "writable path");
    bind_mount(proc_path(writable_fds[i]), w, "the writable path " + w);
    remount(w, /*read_only=*/false);
  }
  writable_fds.clear();
  privates.clear();

  // 6. Read-only paths: inside the writable ones, or shown inside a hidden one.
  for (size_t i = 0; i < read_only.size(); ++i) {
    const std::string& r = read_only[i];
    struct stat st{};
    CA_CHECK(::fstat(read_only_fds[i].get(), &st) == 0, "cannot inspect the read-only path {}", r);
    mount_point(r, st, "read-only path");
    bind_mount(proc_path(read_only_fds[i]), r, "the read-only path " + r);
    remount(r, /*read_only=*/true);
  }
  read_only_fds.clear();
  // A hidden directory inside a path bound since (the evaluation cache's key inside a writable
  // cache) is covered by that bind: hidden again, on top.
  for (size_t i = 0; i < hidden.size(); ++i) {
    const std::string& h = hidden[i];
    const auto covers = [&](const std::string& p) { return path_under(h, p); };
    if (std::any_of(writable.begin(), writable.end(), covers) || std::any_of(read_only.begin(), read_only.end(), covers))
      mount_tmpfs(h, 0500, 4096, MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC);
    else if (hidden_mounted[i])
      remount(h, /*read_only=*/true);
  }

  if (cwd.empty() || ::chdir(cwd.c_str()) != 0) (void)::chdir("/");
  drop_capabilities();
}

std::string scope_signals() {
  // Landlock's scoped restrictions (ABI 6, Linux 6.12). The 6.1 headers Debian 12 ships lack
  // them, so the attribute and the flag are spelled out here as the kernel defines them.
  struct RulesetAttr {
    uint64_t handled_access_fs = 0;
    uint64_t handled_access_net = 0;
    uint64_t scoped = 0;
  };
  constexpr uint64_t kScopeSignal = 1ULL << 1;
  constexpr unsigned kVersionFlag = 1U << 0;  // LANDLOCK_CREATE_RULESET_VERSION
#if defined(SYS_landlock_create_ruleset) && defined(SYS_landlock_restrict_self)
  const long abi = ::syscall(SYS_landlock_create_ruleset, nullptr, 0, kVersionFlag);
  if (abi < 0) {
    const int err = errno;
    return err == EOPNOTSUPP ? "Landlock is built into this kernel but not enabled (add landlock to the lsm= boot "
                               "parameter)"
                             : "this kernel has no Landlock (" + errno_text(err) + ")";
  }
  if (abi < 6) return fmt::format("this kernel's Landlock is ABI {}; scoping signals needs ABI 6 (Linux 6.12)", abi);
  RulesetAttr attr;
  attr.scoped = kScopeSignal;
  const int fd = static_cast<int>(::syscall(SYS_landlock_create_ruleset, &attr, sizeof attr, 0));
  const int err = errno;
  UniqueFd ruleset(fd);
  if (fd < 0) return "landlock_create_ruleset failed: " + errno_text(err);
  if (::prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) return "cannot set no_new_privs: " + errno_text(errno);
  if (::syscall(SYS_landlock_restrict_self, ruleset.get(), 0) != 0)
    return "landlock_restrict_self failed: " + errno_text(errno);
  return "";
#else
  return "this build's system headers do not define the Landlock system calls";
#endif
}

std::string signal_scope_unavailable() {
  int fds[2];
  if (::pipe(fds) != 0) return "pipe failed: " + errno_text(errno);
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::close(fds[0]);
    const std::string why = scope_signals();
    std::string text = why;
    // Scoped: the parent must now be out of reach.
    if (why.empty() && (::kill(::getppid(), 0) == 0 || errno != EPERM))
      text = "the scope took but the parent can still be signalled";
    (void)!::write(fds[1], text.data(), text.size());
    ::_exit(0);
  }
  ::close(fds[1]);
  std::string out;
  char buf[256];
  ssize_t n;
  while ((n = ::read(fds[0], buf, sizeof buf)) > 0) out.append(buf, static_cast<size_t>(n));
  ::close(fds[0]);
  if (pid < 0) return "fork failed";
  int status = 0;
  ::waitpid(pid, &status, 0);
  return out;
}

std::vector<std::pair<std::string, std::string>> private_cache_env() {
  std::random_device random;
  return private_cache_env(fmt::format("/tmp/cuda-agent-caches-{:08x}{:08x}", random(), random()));
}

std::vector<std::pair<std::string, std::string>> private_cache_env(const std::filesystem::path& root_path) {
  const std::string root = root_path.string();
  return {{"CUDA_AGENT_HOST_TMPDIR", host_temp_directory().string()},
          {"TORCHINDUCTOR_CACHE_DIR", root + "/inductor"},
          {"TRITON_CACHE_DIR", root + "/triton"},
          {"TRITON_HOME", root + "/triton-home"},
          {"CUDA_CACHE_PATH", root + "/cuda-jit"},
          {"PYTORCH_KERNEL_CACHE_PATH", root + "/torch-kernels"},
          {"TMPDIR", root + "/tmp"}};
}

std::filesystem::path host_temp_directory() {
  const char* host = std::getenv("CUDA_AGENT_HOST_TMPDIR");
  if (host && *host) return host;
  std::error_code ec;
  const std::filesystem::path usual = std::filesystem::temp_directory_path(ec);
  return ec ? std::filesystem::path("/tmp") : usual;
}

void set_environment(const std::vector<std::pair<std::string, std::string>>& env) {
  for (const auto& [name, value] : env) {
    ::setenv(name.c_str(), value.c_str(), 1);
    if (name != "TMPDIR") continue;
    std::error_code ec;
    std::filesystem::create_directories(value, ec);
    CA_CHECK(!ec, "cannot create the temporary folder {}: {}", value, ec.message());
  }
}

namespace {

volatile sig_atomic_t g_stop_signal = 0;
void note_stop(int signal) { g_stop_signal = signal; }
void note_tick(int) {}  // SIGALRM: waitpid returns EINTR, and the disk is looked at

// SIGKILLs every descendant, round after round, and reaps them, until none is left. Each round
// walks the whole tree, not only this process's children: a child slow to exit (gigabytes of
// memory to give back) keeps its own children (a daemon in a session of its own, say) until it has
// gone, and the walk kills them meanwhile, rather than after the caller may have given up waiting
// for this process and killed it with them still alive.
void clear_descendants(pid_t self) {
  for (int round = 0; round < 10000; ++round) {
    while (::waitpid(-1, nullptr, WNOHANG) > 0) {
    }
    const std::vector<pid_t> tree = descendants_of(self);  // adopted orphans too
    if (tree.empty()) return;
    for (const pid_t pid : tree) ::kill(pid, SIGKILL);
    ::usleep(1000);
  }
}

}  // namespace

uint64_t disk_usage(const std::vector<std::string>& paths, uint64_t stop_after) {
  namespace fs = std::filesystem;
  uint64_t total = 0;
  auto add = [&](const fs::path& p) {
    struct stat st{};
    if (::lstat(p.c_str(), &st) != 0) return;
    // A file's size too where that is more: its blocks may be counted late (delayed allocation).
    const uint64_t blocks = static_cast<uint64_t>(st.st_blocks) * 512;
    total += S_ISREG(st.st_mode) ? std::max(blocks, static_cast<uint64_t>(st.st_size)) : blocks;
  };
  for (const std::string& root : paths) {
    std::error_code ec;
    add(root);
    fs::recursive_directory_iterator it(root, fs::directory_options::skip_permission_denied, ec), end;
    for (; !ec && it != end; it.increment(ec)) {
      add(it->path());
      if (stop_after > 0 && total > stop_after) return total;
    }
  }
  return total;
}

int exec_confined(const ConfinementPlan& plan, const std::vector<std::string>& command,
                  const std::vector<std::pair<std::string, std::string>>& env) {
  if (command.empty()) {
    std::fprintf(stderr, "cuda-agent: no command to run confined\n");
    return 127;
  }
  try {
    if (!plan.signals_only) {
      confine_this_process(plan);
      // No user namespace can be made inside this one: evaluations the command runs skip
      // confining their candidates (sandbox.confine: auto), which would fail after a start.
      ::setenv(kInsideConfinementVariable, "namespaces", 1);
    }
    set_environment(env);
    if (plan.max_file_bytes > 0) {
      const rlimit limit{plan.max_file_bytes, plan.max_file_bytes};
      CA_CHECK(::setrlimit(RLIMIT_FSIZE, &limit) == 0, "cannot limit the size of the files it writes: {}",
               errno_text(errno));
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "cuda-agent: cannot confine the command: %s\n", e.what());
    return 126;
  }
  std::vector<char*> args;
  for (const auto& a : command) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  // This process stays as the command's subreaper: whatever the command starts, daemons that
  // left its session included, is adopted here and ended with it, so nothing of it outlives
  // the call. Where that cannot be set up, the command replaces this process as before.
  struct sigaction stop{};
  stop.sa_handler = note_stop;  // no SA_RESTART: waitpid returns EINTR
  const bool supervise = ::prctl(PR_SET_CHILD_SUBREAPER, 1) == 0;
  if (supervise) {
    for (int s : {SIGTERM, SIGINT, SIGHUP}) ::sigaction(s, &stop, nullptr);
    // Under bubblewrap (--die-with-parent) this process is SIGKILLed when bwrap goes, and a stop
    // of the command's group (a background shell ended before the final score, KillBash, a
    // timeout) ends bwrap at once: killed so, this process never cleared what the command
    // started, and a daemon in a session of its own lived on, into the episode's scoring and
    // after it. The parent's death is a SIGTERM here instead, which clears them first.
    int on_parent_death = 0;
    if (::prctl(PR_GET_PDEATHSIG, &on_parent_death) == 0 && on_parent_death == SIGKILL)
      ::prctl(PR_SET_PDEATHSIG, SIGTERM);
    // The disk watch: what the watched folders hold when the command starts, and the bound it
    // may not pass (the limit, or what they held already when that was more).
    const bool watch = plan.max_watched_bytes > 0 && !plan.watched.empty();
    const uint64_t bound = watch ? std::max(plan.max_watched_bytes, disk_usage(plan.watched)) : 0;
    const pid_t child = ::fork();
    if (child > 0) {
      const pid_t self = ::getpid();
      const bool watch_gpu = plan.max_gpu_memory_bytes > 0;
      int ticks = 0, gpu_over = 0;
      if (watch || plan.max_memory_bytes > 0 || watch_gpu) {
        struct sigaction tick{};
        tick.sa_handler = note_tick;  // no SA_RESTART either
        ::sigaction(SIGALRM, &tick, nullptr);
        const itimerval every{{0, 250000}, {0, 250000}};
        ::setitimer(ITIMER_REAL, &every, nullptr);
      }
      int status = 0;
      while (true) {
        const pid_t r = ::waitpid(child, &status, 0);
        if (r == child) break;
        if (r < 0 && errno != EINTR) break;
        if (g_stop_signal != 0) {
          clear_descendants(self);
          return 128 + g_stop_signal;
        }
        if (watch) {
          const uint64_t used = disk_usage(plan.watched, bound);
          if (used > bound) {
            clear_descendants(self);
            std::fprintf(stderr,
                         "cuda-agent: the command was stopped: the episode's files (%s) grew past %.1f MiB on disk "
                         "(the tools' max_disk_bytes); remove files to go on\n",
                         plan.watched.front().c_str(), static_cast<double>(bound) / (1 << 20));
            return kResourceLimitExitCode;
          }
        }
        if (plan.max_memory_bytes > 0) {
          const unsigned long long held = descendants_rss_bytes(self);
          if (held > plan.max_memory_bytes) {
            clear_descendants(self);
            std::fprintf(stderr,
                         "cuda-agent: the command was stopped: it and what it started held %.1f MiB of memory, past "
                         "%.1f MiB (the tools' max_memory_bytes); use less memory (smaller data, fewer processes) "
                         "to go on\n",
                         static_cast<double>(held) / (1 << 20), static_cast<double>(plan.max_memory_bytes) / (1 << 20));
            return kResourceLimitExitCode;
          }
        }
        if (watch_gpu && ++ticks % 4 == 0) {  // NVML's figures, about every second
          const auto held = gpu_memory_by_process();
          uint64_t used = 0;
          if (held) {
            std::vector<pid_t> evaluations;
            for (const std::string& lock : plan.gpu_lock_files)
              for (const pid_t holder : lock_holders(lock)) evaluations.push_back(holder);
            used = descendants_gpu_bytes(self, *held, evaluations);
          }
          gpu_over = used > plan.max_gpu_memory_bytes ? gpu_over + 1 : 0;
          if (gpu_over >= kGpuMemoryGraceChecks) {
            clear_descendants(self);
            std::fprintf(stderr,
                         "cuda-agent: the command was stopped: it and what it started held %.1f GiB of the GPU's "
                         "memory outside evaluations, past %.1f GiB (an episode's share while episodes share the "
                         "GPU: the tools' max_gpu_memory_bytes); free what long-running commands hold, and time "
                         "full-size work with profile.sh\n",
                         static_cast<double>(used) / (1 << 30),
                         static_cast<double>(plan.max_gpu_memory_bytes) / (1 << 30));
            return kResourceLimitExitCode;
          }
        }
      }
      clear_descendants(self);
      if (WIFEXITED(status)) return WEXITSTATUS(status);
      return WIFSIGNALED(status) ? 128 + WTERMSIG(status) : 1;
    }
    if (child == 0) {
      struct sigaction fallback{};
      fallback.sa_handler = SIG_DFL;
      for (int s : {SIGTERM, SIGINT, SIGHUP}) ::sigaction(s, &fallback, nullptr);
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    }
    // fork failed (child < 0): the command replaces this process below.
  }
  // Signals are scoped here, in the process that becomes the command (this one's child, or this
  // one where it could not fork): the supervisor above stays outside the command's scope, so the
  // command cannot kill it and leave what it started (a daemon that left its session) without a
  // subreaper to end it. Where the kernel cannot scope signals the command runs as before: the
  // namespaces above are the confinement the tool reports; `cuda-agent doctor` says whether
  // signals are scoped.
  (void)scope_signals();
  // Nor can it end or slow what it cannot signal by other means: another process's limits (an
  // RLIMIT_CPU ends it), priority or scheduling. Best-effort like the scope: every kernel with
  // seccomp filters (Linux 3.5) has it.
  try {
    install_syscall_filter({.own_process_only = true});
  } catch (const Error&) {
  }
  ::execvp(args[0], args.data());
  const int err = errno;
  std::fprintf(stderr, "cuda-agent: cannot run %s: %s\n", command[0].c_str(), errno_text(err).c_str());
  if (supervise) ::_exit(127);
  return 127;
}

}  // namespace cuda_agent
