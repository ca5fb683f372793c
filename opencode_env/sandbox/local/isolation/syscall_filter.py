"""The syscall filter every local sandbox command runs under, built with libseccomp (through pyseccomp) once per
process and loaded by seccomp_exec.py as the last step before the command.

Modelled on the default profile of Docker and podman: everything is allowed but what a coding task has no use for
and what widens the kernel surface a hostile agent can reach. Denied (EPERM): new namespaces (unshare, setns, and
clone with a namespace flag; clone3 answers ENOSYS so that libc falls back to clone, whose flags can be checked),
mounting (mount, umount, pivot_root and the new mount API), the kernel keyring, bpf, perf events, userfaultfd,
io_uring, kexec and kernel modules, swap, reboot, the clock, accounting, quotas, the kernel log, open_by_handle_at
(a way around the mount namespace), the old personality and vm86 calls. Allowed, though Docker asks a capability
for some: ptrace and process_vm_* (debuggers and strace work on the task's own processes: the PID namespace and
the uids keep them there). chroot is allowed to OpenCode alone, which puts its tools' commands into the task's root
(seccomp_exec.py); the task's own commands run under TASK_FILTER, which also denies it (a root of the task holds
CAP_SYS_CHROOT in its own namespace, and a second chroot is the classic way out of the first)."""

from __future__ import annotations

import errno
import functools
import tempfile

DENIED = (
    "unshare",
    "setns",
    "mount",
    "umount",
    "umount2",
    "pivot_root",
    "move_mount",
    "open_tree",
    "fsopen",
    "fsconfig",
    "fsmount",
    "fspick",
    "mount_setattr",
    "keyctl",
    "add_key",
    "request_key",
    "bpf",
    "perf_event_open",
    "userfaultfd",
    "io_uring_setup",
    "io_uring_enter",
    "io_uring_register",
    "kexec_load",
    "kexec_file_load",
    "init_module",
    "finit_module",
    "delete_module",
    "create_module",
    "query_module",
    "get_kernel_syms",
    "swapon",
    "swapoff",
    "reboot",
    "settimeofday",
    "clock_settime",
    "clock_adjtime",
    "adjtimex",
    "stime",
    "acct",
    "quotactl",
    "quotactl_fd",
    "syslog",
    "open_by_handle_at",
    "name_to_handle_at",
    "lookup_dcookie",
    "nfsservctl",
    "uselib",
    "ustat",
    "sysfs",
    "_sysctl",
    "vm86",
    "vm86old",
    "iopl",
    "ioperm",
)
NAMESPACE_FLAGS = (
    0x00020000,  # CLONE_NEWNS
    0x02000000,  # CLONE_NEWCGROUP
    0x04000000,  # CLONE_NEWUTS
    0x08000000,  # CLONE_NEWIPC
    0x10000000,  # CLONE_NEWUSER
    0x20000000,  # CLONE_NEWPID
    0x40000000,  # CLONE_NEWNET
    0x00000080,  # CLONE_NEWTIME
)


class FilterError(Exception):
    """The syscall filter could not be built (libseccomp is missing)."""


TASK_ONLY_DENIED = ("chroot",)


@functools.cache
def filter_program(*, task: bool = True) -> bytes:
    """The filter as a BPF program (struct sock_filter entries), for this machine's architecture: the task's, or
    (task=False) OpenCode's, which allows chroot."""
    try:
        import pyseccomp as seccomp  # type: ignore[import-untyped]
    except RuntimeError as error:
        raise FilterError(f"libseccomp is not installed (apt-get install libseccomp2): {error}") from error
    rules = seccomp.SyscallFilter(seccomp.ALLOW)
    for name in (*DENIED, *(TASK_ONLY_DENIED if task else ())):
        number = seccomp.resolve_syscall(seccomp.Arch.NATIVE, name)
        if number != -1:
            rules.add_rule(seccomp.ERRNO(errno.EPERM), number)
    for flag in NAMESPACE_FLAGS:
        rules.add_rule(seccomp.ERRNO(errno.EPERM), "clone", seccomp.Arg(0, seccomp.MASKED_EQ, flag, flag))
    rules.add_rule(seccomp.ERRNO(errno.ENOSYS), "clone3")
    with tempfile.TemporaryFile() as exported:
        rules.export_bpf(exported)
        exported.seek(0)
        return exported.read()
