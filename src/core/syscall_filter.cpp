#include "cuda_agent/core/syscall_filter.h"

#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <sched.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "cuda_agent/core/error.h"

namespace cuda_agent {

namespace {

#if defined(__x86_64__)
constexpr uint32_t kArch = AUDIT_ARCH_X86_64;
#elif defined(__aarch64__)
constexpr uint32_t kArch = AUDIT_ARCH_AARCH64;
#else
#error "the system-call filter knows x86_64 and aarch64 only"
#endif

constexpr uint32_t kIoprioWhoProcess = 1;  // IOPRIO_WHO_PROCESS (linux/ioprio.h is not in every libc's headers)

// Both ABIs are little-endian: an argument's low half first.
constexpr uint32_t arg_low(int i) {
  return offsetof(seccomp_data, args) + 8 * i;
}
constexpr uint32_t arg_high(int i) {
  return arg_low(i) + 4;
}

sock_filter load(uint32_t offset) {
  return BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offset);
}
sock_filter ret(uint32_t action) {
  return BPF_STMT(BPF_RET | BPF_K, action);
}
sock_filter jump(uint16_t op, uint32_t k, uint8_t jt, uint8_t jf) {
  return BPF_JUMP(BPF_JMP | op | BPF_K, k, jt, jf);
}

const sock_filter kAllow = ret(SECCOMP_RET_ALLOW);
const sock_filter kRefuse = ret(SECCOMP_RET_ERRNO | EPERM);

// One rule: the call numbered `nr` runs `body` (which ends in a return on every path); any
// other call skips it, with the call's number still loaded.
void rule(std::vector<sock_filter>& program, long nr, const std::vector<sock_filter>& body) {
  program.push_back(jump(BPF_JEQ, static_cast<uint32_t>(nr), 0, static_cast<uint8_t>(body.size())));
  program.insert(program.end(), body.begin(), body.end());
}

// Refused unless the (int) argument `i` is 0: a pid_t the kernel reads as an int, so its high
// half is ignored there and here.
std::vector<sock_filter> only_zero(int i) {
  return {load(arg_low(i)), jump(BPF_JEQ, 0, 1, 0), kRefuse, kAllow};
}

// Refused unless argument `which` is `self_kind` and argument `who` is 0 (setpriority, ioprio_set).
std::vector<sock_filter> only_self(int which, uint32_t self_kind, int who) {
  return {load(arg_low(which)),
          jump(BPF_JEQ, self_kind, 0, 2),
          load(arg_low(who)),
          jump(BPF_JEQ, 0, 1, 0),
          kRefuse,
          kAllow};
}

}  // namespace

void install_syscall_filter(const SyscallFilter& filter) {
  std::vector<sock_filter> program = {
    load(offsetof(seccomp_data, arch)),
    jump(BPF_JEQ, kArch, 1, 0),
    ret(SECCOMP_RET_ERRNO | ENOSYS),  // another ABI (i386 on x86_64)
    load(offsetof(seccomp_data, nr)),
#if defined(__x86_64__)
    jump(BPF_JGE, 0x40000000u, 0, 1),  // x32 numbers
    ret(SECCOMP_RET_ERRNO | ENOSYS),
#endif
  };
  if (filter.keep_descendants) {
    rule(program, __NR_clone3, {ret(SECCOMP_RET_ERRNO | ENOSYS)});
    rule(program, __NR_prctl, {load(arg_low(0)), jump(BPF_JEQ, PR_SET_CHILD_SUBREAPER, 0, 1), kRefuse, kAllow});
    rule(program, __NR_clone, {load(arg_low(0)), jump(BPF_JSET, CLONE_PARENT, 0, 1), kRefuse, kAllow});
  }
  if (filter.own_process_only) {
    // prlimit64(pid, resource, new, old): another pid's limits may be read (new is NULL), not
    // set. `new` is a pointer: both halves must be 0.
    rule(program, __NR_prlimit64,
         {load(arg_low(0)), jump(BPF_JEQ, 0, 5, 0), load(arg_low(2)), jump(BPF_JEQ, 0, 0, 2), load(arg_high(2)),
          jump(BPF_JEQ, 0, 1, 0), kRefuse, kAllow});
    rule(program, __NR_setpriority, only_self(0, PRIO_PROCESS, 1));
    rule(program, __NR_ioprio_set, only_self(0, kIoprioWhoProcess, 1));
    for (long nr : {__NR_sched_setaffinity, __NR_sched_setscheduler, __NR_sched_setparam, __NR_sched_setattr})
      rule(program, nr, only_zero(0));
  }
  program.push_back(kAllow);
  CA_ASSERT(program.size() < 0xffff, "the system-call filter is too long");
  sock_fprog prog{static_cast<unsigned short>(program.size()), program.data()};
  CA_CHECK(::prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) == 0, "prctl(PR_SET_NO_NEW_PRIVS) failed: errno {}", errno);
  // SPEC_ALLOW: a seccomp filter makes the kernel (on its seccomp default, as before Linux 5.16)
  // switch the speculative-store-bypass and indirect-branch mitigations on for the process, which
  // slows its Python several times over and with it every forward the candidate times; the
  // judge, with no filter, runs without them. The filter is about processes, not speculation
  // (docs/integrity.md, residual risks). Kernels older than 4.17 lack the flag: prctl then.
  if (::syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, SECCOMP_FILTER_FLAG_SPEC_ALLOW, &prog) == 0) return;
  CA_CHECK(errno == EINVAL || errno == ENOSYS, "installing the seccomp filter failed: errno {}", errno);
  CA_CHECK(::prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog) == 0, "installing the seccomp filter failed: errno {}",
           errno);
}

}  // namespace cuda_agent
