"""The seccomp filter of the program's processes, built with libseccomp (through ``pyseccomp``).

Defence in depth behind the namespaces: system calls no benchmark program needs, and whose
kernel code has been the way out of sandboxes before, fail with ``EPERM`` (asynchronous I/O
rings, user-mode page faults, BPF, performance counters, keyrings, tracing, signals through
process descriptors (``pidfd_*``: no audit event, so at the audit-hook level the program could
kill its judge or the host's processes unseen), signals through a descriptor's owner (``fcntl``
``F_SETOWN``/``F_SETSIG``/``F_SETOWN_EX``, ``ioctl`` ``FIOSETOWN``/``SIOCSPGRP``: with
``O_ASYNC`` each write to a pipe signals the owner, a judge or any process a root program
names), other processes' resource limits (``prlimit64`` setting them for a pid other than
0, the caller), mounts, new
namespaces (``unshare``, ``setns``, and ``clone`` with a ``CLONE_NEW*`` flag; ``clone3``
answers ``ENOSYS``, so libc falls back to ``clone``), kernel modules, another process's
memory), as do sockets of the ``AF_VSOCK``
(the hypervisor) and ``AF_PACKET`` (raw frames) families. Where no process may be started
(the audit-hook level without a way to bound them), ``execve`` fails too, so that
``_posixsubprocess.fork_exec``, which bypasses the audit hook, starts nothing.

The host builds the filter once per process (here, with the library) and hands its BPF to
the launcher, which loads it in the program's process as its last step, after
``PR_SET_NO_NEW_PRIVS`` (:func:`pytest_modelbench.sandbox.launcher.load_filter`): the
launcher itself stays standard library only. Without libseccomp the runs go on without the
filter, and the summary's ``sandbox`` record says so.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import tempfile

REFUSED = (
    "io_uring_setup",
    "io_uring_enter",
    "io_uring_register",
    "userfaultfd",
    "bpf",
    "perf_event_open",
    "keyctl",
    "add_key",
    "request_key",
    "ptrace",
    "pidfd_open",
    "pidfd_send_signal",
    "pidfd_getfd",
    "process_vm_readv",
    "process_vm_writev",
    "mount",
    "umount2",
    "move_mount",
    "open_tree",
    "fsopen",
    "fsconfig",
    "fsmount",
    "fspick",
    "pivot_root",
    "chroot",
    "unshare",
    "setns",
    "init_module",
    "finit_module",
    "delete_module",
    "kexec_load",
    "kexec_file_load",
    "open_by_handle_at",
    "name_to_handle_at",
    "fanotify_init",
    "swapon",
    "swapoff",
    "reboot",
)
SPAWNING = ("execve", "execveat")  # refused too where no process may be started
AF_PACKET = 17
AF_VSOCK = 40
REFUSED_FAMILIES = (AF_PACKET, AF_VSOCK)
# fcntl() commands and ioctl() requests that name a process to signal when the descriptor is
# ready (with O_ASYNC): a signal to any process the caller may signal, with no audit event
SIGNAL_OWNER_FCNTL = (8, 10, 15)  # F_SETOWN, F_SETSIG, F_SETOWN_EX
SIGNAL_OWNER_IOCTL = (0x8901, 0x8902)  # FIOSETOWN, SIOCSPGRP
COMMAND_MASK = 0xFFFFFFFF  # the kernel reads both as 32-bit: the upper half is ignored
# clone() flags that make new namespaces (the way around a refused unshare/setns)
CLONE_NEW_FLAGS = (
    0x00020000,  # CLONE_NEWNS
    0x02000000,  # CLONE_NEWCGROUP
    0x04000000,  # CLONE_NEWUTS
    0x08000000,  # CLONE_NEWIPC
    0x10000000,  # CLONE_NEWUSER
    0x20000000,  # CLONE_NEWPID
    0x40000000,  # CLONE_NEWNET
    0x00000080,  # CLONE_NEWTIME
)


@functools.cache
def program_filter(spawn: bool) -> bytes | None:
    """The filter's BPF (``struct sock_filter`` entries), or None where libseccomp is not
    available; ``spawn`` False also refuses ``execve``."""
    try:
        import pyseccomp  # function-level: loads libseccomp, only where a sandbox runs
    except (ImportError, RuntimeError, OSError):  # not installed, or no libseccomp.so
        return None
    refuse = pyseccomp.ERRNO(errno.EPERM)
    built = pyseccomp.SyscallFilter(pyseccomp.ALLOW)
    for name in REFUSED + (() if spawn else SPAWNING):
        try:
            built.add_rule(refuse, name)
        except (OSError, ValueError, RuntimeError):  # not a system call on this kernel/arch
            continue
    for family in REFUSED_FAMILIES:
        built.add_rule(refuse, "socket", pyseccomp.Arg(0, pyseccomp.EQ, family))
    for flag in CLONE_NEW_FLAGS:  # threads and processes, but no new namespaces
        built.add_rule(refuse, "clone", pyseccomp.Arg(0, pyseccomp.MASKED_EQ, flag, flag))
    for call, commands in (("fcntl", SIGNAL_OWNER_FCNTL), ("ioctl", SIGNAL_OWNER_IOCTL)):
        for command in commands:
            built.add_rule(
                refuse, call, pyseccomp.Arg(1, pyseccomp.MASKED_EQ, COMMAND_MASK, command)
            )
    # another process's limits (a judge's, a host process's): pid 0 is the caller itself
    built.add_rule(
        refuse, "prlimit64", pyseccomp.Arg(0, pyseccomp.NE, 0), pyseccomp.Arg(2, pyseccomp.NE, 0)
    )
    # clone3 passes its flags in memory a filter cannot read: as if the kernel lacked it
    with contextlib.suppress(OSError, ValueError, RuntimeError):
        built.add_rule(pyseccomp.ERRNO(errno.ENOSYS), "clone3")
    with tempfile.TemporaryFile() as handle:
        built.export_bpf(handle)
        handle.seek(0)
        return handle.read()
